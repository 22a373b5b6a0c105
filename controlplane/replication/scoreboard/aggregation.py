"""The scoreboard's sums: per-replica scores (``scoring.py``) aggregated per policy, forecaster
and tenant, and each plan item's modelled value beside what can be credited and what was."""

from __future__ import annotations

from django.db.models import Count, Q, Sum

from ..choices import ItemDecision
from ..models import PlanItem
from ..plans.costs import cost_model_for, prefill_s
from ..scoring import MEASURED

_AGG = {
    "replicas": Count("id"),
    "scored": Count("id", filter=Q(scored_at__isnull=False)),
    "scored_hit": Count("id", filter=Q(scored_at__isnull=False, hits__gt=0)),
    # Filters on hits before the "hits" alias below shadows the field.
    "measured_saving": Count(
        "id", filter=Q(scored_at__isnull=False, hits__gt=0, saving_basis=MEASURED)
    ),
    "used": Count("id", filter=Q(scored_at__isnull=False, hits__gt=0)),
    "hits": Sum("hits"),
    "measured": Count("id", filter=Q(scored_at__isnull=False, hits_measured=True)),
    "bytes_moved": Sum("bytes_moved"),
    "nominal_bytes": Sum("bytes"),
    "vram_byte_seconds": Sum("vram_byte_seconds"),
    "host_byte_seconds": Sum("host_byte_seconds"),
    "ttft_saved_s": Sum("ttft_saved_s"),
    "cost_s": Sum("cost_s"),
}


def hits_basis(scored: int, measured: int) -> str:
    """measured | estimated | mixed: whether hits come from served-request records."""
    if scored and measured >= scored:
        return "measured"
    return "mixed" if measured else "estimated"


def _metrics(row: dict) -> dict:
    scored = row.get("scored") or 0
    measured = row.get("measured") or 0
    return {
        "replicas": row.get("replicas") or 0,
        "hits": row.get("hits") or 0,
        "hits_basis": hits_basis(scored, measured),
        "hits_measured_replicas": measured,
        "precision": (row.get("scored_hit") or 0) / scored if scored else None,
        "bytes_moved": row.get("bytes_moved") or 0,
        "vram_byte_seconds": float(row.get("vram_byte_seconds") or 0.0),
        "host_byte_seconds": float(row.get("host_byte_seconds") or 0.0),
        "ttft_saved_s": float(row.get("ttft_saved_s") or 0.0),
        "saving_basis": hits_basis(row.get("used") or 0, row.get("measured_saving") or 0)
        .replace("measured", "measured TTFT")
        .replace("estimated", "cost model"),
        "cost_s": float(row.get("cost_s") or 0.0),
        "scored": scored,
        "nominal_bytes": row.get("nominal_bytes") or 0,
    }


_PRIVATE = ("scored", "nominal_bytes")


def _public(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in _PRIVATE}


def _grouped(qs, field: str, name: str, extra: str | None = None) -> list[dict]:
    fields = [field] + ([extra] if extra else [])
    out = []
    for row in qs.values(*fields).annotate(**_AGG).order_by(field):
        entry = {name: row[field] if row[field] not in (None, "") else "(none)"}
        if extra:
            entry["mode"] = row[extra]
        out.append({**entry, **_public(_metrics(row))})
    return out


def creditable_s(item: PlanItem) -> float:
    """What the scoreboard can credit a plan item at most: one prefill of its prefix on its
    target (a used replica spares its engine the first prefill; the rest its engine would have
    served from its own cache). More is only claimed by the holdout's measured uplift."""
    tokens = item.prefix_tokens or len(item.prefix_keys) * item.target.block_size
    return prefill_s(cost_model_for(item.target.model), tokens)


def items(since, until, limit: int = 50) -> list[dict]:
    """Approved items of the window, newest first: the planner's modelled saving (a model,
    queue effects included), what the scoreboard can credit (one prefill), and what was credited
    (scored replicas' ``ttft_saved_s``), item by item."""
    rows = (
        PlanItem.objects.filter(
            plan__created_at__gte=since,
            plan__created_at__lt=until,
            decision__in=(ItemDecision.APPROVED, ItemDecision.HELD_OUT),
        )
        .select_related("target", "workload_key")
        .annotate(
            realised=Sum("replicas__ttft_saved_s"),
            used=Count("replicas", filter=Q(replicas__hits__gt=0)),
        )
        .order_by("-pk")[:limit]
    )
    return [
        {
            "item": i.pk,
            "plan": i.plan_id,
            "tenant": i.workload_key.tenant if i.workload_key_id else "(none)",
            "decision": i.decision,
            "modelled_s": i.expected_ttft_saved_s,
            "creditable_s": creditable_s(i),
            "realised_s": float(i.realised or 0.0),
            "used": bool(i.used),
        }
        for i in rows
    ]
