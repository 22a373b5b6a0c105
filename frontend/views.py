"""Dashboard pages: server-rendered tables and data for the charts; actions go through the REST API.

Every page needs a signed-in user with a role; pages for operators or admins refuse lesser roles
server-side (403), whatever the browser shows or hides.
"""

from __future__ import annotations

from datetime import timedelta
from functools import wraps
from pathlib import Path

import plotly
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Sum
from django.http import FileResponse, Http404
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET
from django.views.static import serve

from controlplane.accounts.choices import Role
from controlplane.accounts.roles import has_role, role_of
from controlplane.audit.filtersets import AuditEventFilterSet
from controlplane.audit.models import AuditEvent
from controlplane.core.misses import MISSES, REASONS
from controlplane.demand.filtersets import MissBucketFilterSet, WorkloadKeyFilterSet
from controlplane.demand.models import DemandBucket, MissBucket, WorkloadKey
from controlplane.fleet.choices import NodeState
from controlplane.fleet.configured_index import get_index
from controlplane.fleet.models import Engine, Gpu, GpuSample, Node
from controlplane.readmodels.cachemap import DEFAULT_ENGINES_PER_PAGE, DEFAULT_PREFIXES, STATES
from controlplane.readmodels.dashboard import cluster_summary
from controlplane.readmodels.doctor import report as doctor_report
from controlplane.readmodels.misses import WINDOWS as MISS_WINDOWS
from controlplane.readmodels.misses import misses_summary
from controlplane.replication.choices import (
    JobState,
    OverrideKind,
    PolicyMode,
    PolicyStrategy,
    StorageTier,
    Transport,
)
from controlplane.replication.filtersets import (
    OverrideFilterSet,
    ReplicationJobFilterSet,
    ReplicationPlanFilterSet,
)
from controlplane.replication.models import (
    Override,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from controlplane.replication.scoreboard import scoreboard as score

ASSETS = Path(__file__).resolve().parent / "static" / "frontend"
PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
HISTORY = timedelta(hours=24)
MAX_HISTORY_POINTS = 1440


def needs(role: str):
    """Signed in and at least ``role``; otherwise the login page or 403."""

    def wrap(view):
        @login_required
        @wraps(view)
        def inner(request, *args, **kwargs):
            if not has_role(request.user, role):
                raise PermissionDenied(f"this page needs the {role} role")
            return view(request, *args, **kwargs)

        return inner

    return wrap


def page(request, template: str, nav: str, status: int = 200, **context):
    role = role_of(request.user)
    kept = request.GET.copy()  # filters survive paging
    kept.pop("page", None)
    return render(
        request,
        f"frontend/{template}",
        {
            "nav": nav,
            "role": role,
            "extra_query": f"&{kept.urlencode()}" if kept else "",
            "can_operate": has_role(request.user, Role.OPERATOR),
            "can_admin": has_role(request.user, Role.ADMIN),
            **context,
        },
        status=status,
    )


def paged(request, queryset, per_page: int):
    return Paginator(queryset, per_page).get_page(request.GET.get("page"))


def filtered(request, filterset_class, queryset) -> tuple:
    """``queryset`` filtered by the app's FilterSet (the one the API uses) from the query string:
    (queryset, context for page()). A bad value is a 400 page naming the field, with no rows."""
    filterset = filterset_class(request.GET, queryset=queryset, request=request)
    if filterset.is_valid():
        return filterset.qs, {}
    field, errors = next(iter(filterset.errors.items()))
    return queryset.none(), {"status": 400, "filter_error": f"{field}: {errors[0]}"}


@require_GET
def asset(request, path: str):
    """Our own CSS and ES modules (daphne serves no static files in the embedded default)."""
    response = serve(request, path, document_root=str(ASSETS))
    response["Cache-Control"] = "no-cache"
    return response


@require_GET
def plotly_js(request):
    """Plotly.js from the plotly package: no CDN, works offline."""
    if not PLOTLY_JS.exists():
        raise Http404("the plotly package has no bundled plotly.min.js")
    response = FileResponse(PLOTLY_JS.open("rb"), content_type="text/javascript")
    response["Cache-Control"] = "public, max-age=86400"
    return response


@needs(Role.VIEWER)
def cache_map(request):
    # The header has figures on first paint; the socket only updates them.
    return page(
        request,
        "cachemap.html",
        "map",
        states=STATES,
        summary=cluster_summary(),
        page_size=DEFAULT_ENGINES_PER_PAGE,
        prefixes=DEFAULT_PREFIXES,
    )


def _history(gpus) -> list[dict]:
    since = timezone.now() - HISTORY
    out = []
    for gpu in gpus:
        samples = list(
            GpuSample.objects.filter(gpu=gpu, at__gte=since).order_by("-at")[:MAX_HISTORY_POINTS]
        )
        samples.reverse()
        out.append(
            {
                "gpu": str(gpu),
                "total": gpu.memory_total,
                "at": [s.at.isoformat() for s in samples],
                "memory_used": [s.memory_used for s in samples],
                "kv_bytes": [s.kv_bytes for s in samples],
                "speculative_bytes": [s.speculative_bytes for s in samples],
                "utilization": [s.utilization_gpu for s in samples],
            }
        )
    return out


@needs(Role.VIEWER)
def node_detail(request, pk: int):
    node = get_object_or_404(Node, pk=pk)
    gpus = list(node.gpus.select_related("claimed_by"))
    engines = list(node.engines.prefetch_related("gpus"))
    index = get_index()
    for engine in engines:
        engine.blocks = index.usage(engine.pk).blocks
    allowed = node.reenrol_allowed_until
    return page(
        request,
        "node.html",
        "map",
        node=node,
        gpus=gpus,
        engines=engines,
        # GPUs this node reported that another node owns: left out of its reports.
        refused=list(node.claimed_gpus.select_related("node")),
        reenrol_allowed_until=allowed if allowed and allowed > timezone.now() else None,
        retired=node.state == NodeState.RETIRED,
        history=_history(gpus),
    )


@needs(Role.VIEWER)
def gpu_detail(request, pk: int):
    gpu = get_object_or_404(Gpu.objects.select_related("node", "claimed_by"), pk=pk)
    return page(
        request,
        "gpu.html",
        "map",
        gpu=gpu,
        engines=gpu.engines.all(),
        # Where another node claims it, admins reassign it to any node not retired.
        nodes=Node.objects.exclude(state=NodeState.RETIRED).order_by("name"),
        history=_history([gpu]),
    )


@needs(Role.VIEWER)
def engine_detail(request, pk: int):
    engine = get_object_or_404(Engine.objects.select_related("node"), pk=pk)
    gpus = list(engine.gpus.all())
    replicas = SpeculativeReplica.objects.filter(engine=engine).select_related("workload_key")[:50]
    jobs = ReplicationJob.objects.filter(target=engine).select_related("source__node")[:50]
    return page(
        request,
        "engine.html",
        "map",
        engine=engine,
        gpus=gpus,
        replicas=replicas,
        jobs=jobs,
        blocks=get_index().usage(engine.pk).blocks,
        history=_history(gpus),
    )


@needs(Role.VIEWER)
def forecasts(request):
    keys = WorkloadKey.objects.order_by("tenant", "model", "prefix_group")
    keys, refused = filtered(request, WorkloadKeyFilterSet, keys)
    keys_page = paged(request, keys, 50)
    latest = {}
    for key in keys_page:
        latest[key.pk] = key.forecasts.order_by("-generated_at").first()
    selected = None
    if request.GET.get("key", "").isdigit():
        selected = WorkloadKey.objects.filter(pk=int(request.GET["key"])).first()
    elif keys_page:
        selected = keys_page[0]
    chart, forecast = None, None
    if selected is not None:
        forecast = selected.forecasts.order_by("-generated_at").first()
        buckets = list(
            DemandBucket.objects.filter(key=selected).order_by("-start")[:MAX_HISTORY_POINTS]
        )
        buckets.reverse()
        chart = {
            "title": str(selected),
            "actual_at": [b.start.isoformat() for b in buckets],
            "actual": [b.requests for b in buckets],
        }
        if forecast is not None:
            step = timedelta(seconds=forecast.bucket_s)
            chart.update(
                forecast_at=[
                    (forecast.start + i * step).isoformat() for i in range(len(forecast.yhat))
                ],
                yhat=forecast.yhat,
                lower=forecast.lower,
                upper=forecast.upper,
                model=forecast.model,
            )
    rows = [(k, latest.get(k.pk)) for k in keys_page]
    return page(
        request,
        "forecasts.html",
        "forecasts",
        keys_page=keys_page,
        rows=rows,
        selected=selected,
        forecast=forecast,
        chart=chart,
        **refused,
    )


@needs(Role.VIEWER)
def plans(request):
    qs = (
        ReplicationPlan.objects.select_related("policy")
        .order_by("-created_at", "-id")
        .annotate(
            saving=Sum("items__expected_ttft_saved_s"),
            bytes=Sum("items__bytes"),
            cost=Sum("items__cost_s"),
        )
    )
    qs, refused = filtered(request, ReplicationPlanFilterSet, qs)
    return page(
        request,
        "plans.html",
        "plans",
        plans_page=paged(request, qs, 25),
        state=request.GET.get("state", ""),
        **refused,
    )


@needs(Role.VIEWER)
def plan_detail(request, pk: int):
    plan = get_object_or_404(ReplicationPlan.objects.select_related("policy", "decided_by"), pk=pk)
    items = list(plan.items.select_related("target__node", "source__node", "workload_key"))
    # Each item's demand by its two parts (``core.policy.demand``): measured and forecast.
    demand = (plan.summary or {}).get("demand", {})
    for i in items:
        i.demand_parts = demand.get(str(i.workload_key_id))
    return page(request, "plan.html", "plans", plan=plan, items=items)


@needs(Role.VIEWER)
def jobs(request):
    qs = ReplicationJob.objects.select_related("source__node", "target__node").prefetch_related(
        "transitions"
    )
    qs, refused = filtered(request, ReplicationJobFilterSet, qs)
    return page(
        request,
        "jobs.html",
        "jobs",
        jobs_page=paged(request, qs, 50),
        state=request.GET.get("state", ""),
        states=[s for s, _ in JobState.CHOICES],
        **refused,
    )


@needs(Role.VIEWER)
def policies(request):
    return page(
        request,
        "policies.html",
        "policies",
        policies=Policy.objects.all(),
        blank=Policy(),
        modes=PolicyMode.CHOICES,
        strategies=PolicyStrategy.CHOICES,
        transports=Transport.CHOICES,
    )


@needs(Role.VIEWER)
def overrides(request):
    qs, refused = filtered(
        request,
        OverrideFilterSet,
        Override.objects.select_related("node", "engine__node", "created_by"),
    )
    return page(
        request,
        "overrides.html",
        "overrides",
        overrides_page=paged(request, qs, 50),
        kinds=OverrideKind.CHOICES,
        **refused,
        nodes=Node.objects.all()[:1000],
        engines=Engine.objects.select_related("node")[:2000],
        tiers=StorageTier.CHOICES,
    )


WINDOWS = {"1d": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30)}


@needs(Role.VIEWER)
def scoreboard(request):
    window = request.GET.get("window", "7d")
    if window not in WINDOWS:
        window = "7d"
    now = timezone.now()
    return page(
        request,
        "scoreboard.html",
        "scoreboard",
        board=score(now - WINDOWS[window], now),
        window=window,
        windows=list(WINDOWS),
    )


@needs(Role.OPERATOR)
def audit(request):
    qs, refused = filtered(request, AuditEventFilterSet, AuditEvent.objects.select_related("actor"))
    return page(
        request,
        "audit.html",
        "audit",
        events=paged(request, qs, 50),
        action=request.GET.get("action", ""),
        object_type=request.GET.get("object_type", ""),
        **refused,
    )


@needs(Role.VIEWER)
def misses(request):
    """Why requests missed: reasons over time per tenant, delivered vs speed of light."""
    window = request.GET.get("window", "1h")
    if window not in MISS_WINDOWS:
        window = "1h"
    qs, refused = filtered(request, MissBucketFilterSet, MissBucket.objects.all())
    now = timezone.now()
    summary = misses_summary(qs, now - MISS_WINDOWS[window], now)
    return page(
        request,
        "misses.html",
        "misses",
        summary=summary,
        window=window,
        windows=list(MISS_WINDOWS),
        reasons=REASONS,
        miss_reasons=MISSES,
        tenant=request.GET.get("tenant", ""),
        tenants=WorkloadKey.objects.order_by("tenant")
        .values_list("tenant", flat=True)
        .distinct()[:500],
        **refused,
    )


@needs(Role.VIEWER)
def doctor(request):
    """The fleet doctor: silent KV-routing faults, each with the setting to change."""
    return page(request, "doctor.html", "doctor", **doctor_report())
