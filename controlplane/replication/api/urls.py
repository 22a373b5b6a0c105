from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("policies", views.PolicyViewSet)
router.register("overrides", views.OverrideViewSet)
router.register("plans", views.PlanViewSet)
router.register("replication-jobs", views.ReplicationJobViewSet)
router.register("speculative-replicas", views.SpeculativeReplicaViewSet)
urlpatterns = [
    path("scoreboard/", views.ScoreboardView.as_view(), name="scoreboard"),
    *router.urls,
]
