from django.urls import path
from rest_framework.routers import SimpleRouter

from . import agent_views, views

router = SimpleRouter()
router.register("policies", views.PolicyViewSet)
router.register("overrides", views.OverrideViewSet)
router.register("plans", views.PlanViewSet)
router.register("replication-jobs", views.ReplicationJobViewSet)
router.register("speculative-replicas", views.SpeculativeReplicaViewSet)
urlpatterns = [
    path("agents/jobs/", agent_views.agent_jobs, name="agent-jobs"),
    path("agents/jobs/<uuid:job_id>/events/", agent_views.JobEventsView.as_view(), name="agent-job-events"),
    path("scoreboard/", views.ScoreboardView.as_view(), name="scoreboard"),
    *router.urls,
]
