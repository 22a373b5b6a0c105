from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GpuViewSet)
router.register("engines", views.EngineViewSet)

urlpatterns = [
    path("residency/lookup/", views.ResidencyLookupView.as_view(), name="residency-lookup"),
    *router.urls,
]
