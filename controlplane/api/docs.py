"""The interactive API docs, served whole by the control plane: Swagger UI's files come from the
``drf-spectacular-sidecar`` package (no CDN, so offline clusters have them and the CSP's
``script-src 'self'`` allows them), and its start-up script is a file of its own
(``SpectacularSwaggerSplitView``), since the CSP forbids inline scripts."""

from pathlib import Path

import drf_spectacular_sidecar
from django.views.decorators.http import require_GET
from django.views.static import serve

SIDECAR = (
    Path(drf_spectacular_sidecar.__file__).resolve().parent / "static" / "drf_spectacular_sidecar"
)


@require_GET
def sidecar_asset(request, path: str):
    """Swagger UI / ReDoc files (daphne serves no static files; these change only with the pin)."""
    response = serve(request, path, document_root=str(SIDECAR))
    response["Cache-Control"] = "public, max-age=86400"
    return response
