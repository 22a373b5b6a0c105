"""URL map: REST API under /api/, OpenAPI at /api/schema/ and /api/docs/, the dashboard at /."""

from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane.metrics import MetricsView


def healthz(request):
    return JsonResponse({"ok": True})


api = [
    path("", include("controlplane.fleet.api.urls")),
    path("", include("controlplane.demand.api.urls")),
    path("", include("controlplane.forecasting.api.urls")),
    path("", include("controlplane.replication.api.urls")),
    path("", include("controlplane.audit.api.urls")),
    path("", include("controlplane.accounts.api.urls")),
    path("metrics/", MetricsView.as_view(), name="metrics"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/", include(api)),
    path("", include("frontend.urls")),
]
