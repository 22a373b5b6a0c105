from django.urls import path

from . import reports, views

urlpatterns = [
    path("agents/enrol/", reports.EnrolView.as_view(), name="agent-enrol"),
    path("agents/report/", reports.ReportView.as_view(), name="agent-report"),
    path("agents/rotate-token/", reports.RotateTokenView.as_view(), name="agent-rotate-token"),
    path("agents/heartbeat/", reports.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("agents/jobs/", views.agent_jobs, name="agent-jobs"),
    path(
        "agents/jobs/<uuid:job_id>/events/", views.JobEventsView.as_view(), name="agent-job-events"
    ),
]
