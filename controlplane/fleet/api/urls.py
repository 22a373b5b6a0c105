from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GpuViewSet)
router.register("engines", views.EngineViewSet)

urlpatterns = [
    path("agents/enrol/", views.EnrolView.as_view(), name="agent-enrol"),
    path("agents/report/", views.ReportView.as_view(), name="agent-report"),
    path("agents/rotate-token/", views.RotateTokenView.as_view(), name="agent-rotate-token"),
    path("agents/heartbeat/", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("residency/lookup/", views.ResidencyLookupView.as_view(), name="residency-lookup"),
    *router.urls,
]
