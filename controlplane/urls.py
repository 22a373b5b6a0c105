"""URL map: REST API under /api/, OpenAPI at /api/schema/ and /api/docs/, the dashboard at /."""

from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from controlplane.api.docs import sidecar_asset
from controlplane.readmodels.metrics import MetricsView


def healthz(request):
    return JsonResponse({"ok": True})


api = [
    path("", include("controlplane.fleet.api.urls")),
    path("", include("controlplane.demand.api.urls")),
    path("", include("controlplane.forecasting.api.urls")),
    path("", include("controlplane.replication.api.urls")),
    path("", include("controlplane.accounts.api.urls")),
    path("", include("controlplane.agentapi.urls")),
    path("", include("controlplane.readmodels.api.urls")),
    path("metrics/", MetricsView.as_view(), name="metrics"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    # The sidecar's files where drf-spectacular links them (STATIC_URL + the package's folder).
    path("static/drf_spectacular_sidecar/<path:path>", sidecar_asset, name="sidecar-asset"),
    path("api/", include(api)),
    path("", include("frontend.urls")),
]
