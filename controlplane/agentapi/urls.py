from django.urls import path

from . import views

urlpatterns = [
    path("agents/jobs/", views.agent_jobs, name="agent-jobs"),
    path(
        "agents/jobs/<uuid:job_id>/events/", views.JobEventsView.as_view(), name="agent-job-events"
    ),
]
