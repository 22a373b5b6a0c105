"""The cache map's API: one page of engines x the hottest prefixes (frontend/static/cachemap.js)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.choices import Role
from controlplane.api.exceptions import ApiError
from controlplane.demand.filtersets import MissBucketFilterSet
from controlplane.demand.models import MissBucket

from ..cachemap import (
    DEFAULT_ENGINES_PER_PAGE,
    DEFAULT_PREFIXES,
    MAX_ENGINES_PER_PAGE,
    MAX_PREFIXES,
    cache_map,
)
from ..doctor import report as doctor_report
from ..misses import WINDOWS, misses_summary


def _int_param(request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError("invalid", f"{name} must be an integer", name) from None
    if not lo <= value <= hi:
        raise ApiError("invalid", f"{name} must be between {lo} and {hi}", name)
    return value


class CacheMapView(APIView):
    """One page of engines (grouped by node) x the hottest prefixes, and each GPU's VRAM split."""

    read_role = Role.VIEWER

    @extend_schema(responses={200: dict}, tags=["dashboard"])
    def get(self, request):
        engine_ids = None
        if request.query_params.get("engines"):
            try:
                engine_ids = [int(x) for x in request.query_params["engines"].split(",")][
                    :MAX_ENGINES_PER_PAGE
                ]
            except ValueError:
                raise ApiError(
                    "invalid", "engines must be comma-separated engine ids", "engines"
                ) from None
        return Response(
            cache_map(
                offset=_int_param(request, "offset", 0, 0, 10**9),
                limit=_int_param(
                    request, "limit", DEFAULT_ENGINES_PER_PAGE, 1, MAX_ENGINES_PER_PAGE
                ),
                prefixes=_int_param(request, "prefixes", DEFAULT_PREFIXES, 1, MAX_PREFIXES),
                engine_ids=engine_ids,
            )
        )


class MissesView(APIView):
    """Why requests missed, over a window (``window``: 15m, 1h, 6h, 1d, 7d; default 1h), per
    tenant and serving engine, filtered like ``/api/miss-buckets/`` (tenant, model,
    prefix_group, engine, key)."""

    read_role = Role.VIEWER

    @extend_schema(
        responses={200: dict},
        tags=["dashboard"],
        parameters=[
            OpenApiParameter("window", str, enum=list(WINDOWS), default="1h"),
            *(OpenApiParameter(f, str) for f in ("tenant", "model", "prefix_group")),
            *(OpenApiParameter(f, int) for f in ("engine", "key")),
        ],
    )
    def get(self, request):
        window = request.query_params.get("window") or "1h"
        if window not in WINDOWS:
            raise ApiError("invalid", f"window must be one of {', '.join(WINDOWS)}", "window")
        filterset = MissBucketFilterSet(
            request.query_params, queryset=MissBucket.objects.all(), request=request
        )
        if not filterset.is_valid():
            field, errors = next(iter(filterset.errors.items()))
            raise ApiError("invalid", str(errors[0]), field)
        until = timezone.now()
        return Response(misses_summary(filterset.qs, until - WINDOWS[window], until))


class DoctorView(APIView):
    """The fleet doctor: what makes KV-aware routing or Prewarm's accounting wrong, each finding
    with the setting to change (docs/deploy.md, "Troubleshooting KV-aware routing")."""

    read_role = Role.VIEWER

    @extend_schema(responses={200: dict}, tags=["dashboard"])
    def get(self, request):
        return Response(doctor_report())
