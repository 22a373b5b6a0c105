"""Why requests missed: the miss buckets of a window, per tenant and engine, with the
speed-of-light hit rate, routed vs delivered, and the misses speculation could remove beside the
scoreboard's verdict. The shape is what ``GET /api/misses/`` returns and ``/misses/`` draws.

Reasons were decided when each record was ingested (``controlplane/demand/misses.py``); this
only sums them. *Speculable* misses (``core.misses.speculable``) are the ``cold`` misses in a
bucket of a burst of their workload key or in the ``PREWARM_MISS_BURST_LEAD_SECONDS`` before
one: a copy placed ahead of the burst could have served them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import QuerySet, Sum

from controlplane.core import misses as m
from controlplane.demand.misses import MISS_COUNTERS
from controlplane.demand.models import DemandBucket, MissBucket
from controlplane.replication.scoreboard import scoreboard

OTHER_TENANTS = "other"
SERIES_TENANTS = 12  # tenants drawn on their own on the page; the rest are summed as "other"


def _rates(c: dict) -> dict:
    n = sum(c.get(r, 0) for r in m.REASONS)
    misses = sum(c.get(r, 0) for r in m.MISSES)
    prefix = c.get("prefix_tokens", 0)
    return {
        "requests": n,
        "reasons": {r: c.get(r, 0) for r in m.REASONS},
        "misses": misses,
        "delivered_hit_rate": c.get(m.HIT, 0) / n if n else None,
        "speed_of_light_hit_rate": c.get("sol_hits", 0) / n if n else None,
        "delivered_token_rate": min(1.0, c.get("cached_tokens", 0) / prefix) if prefix else None,
        "speed_of_light_token_rate": c.get("sol_cached_tokens", 0) / prefix if prefix else None,
    }


def _speculable(qs: QuerySet, since: datetime, until: datetime) -> dict[int, int]:
    """Cold misses speculation could remove, per workload key (keys with cold misses only)."""
    step = settings.PREWARM_DEMAND_BUCKET_SECONDS
    cold: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for key_id, start, n in (
        qs.filter(cold__gt=0, seconds=step).values_list("key_id", "start").annotate(n=Sum("cold"))
    ):
        cold[key_id][int(start.timestamp())] += n
    if not cold:
        return {}
    lead = max(0, settings.PREWARM_MISS_BURST_LEAD_SECONDS // step)
    t0 = int(since.timestamp()) // step * step
    slots = max(1, (int(until.timestamp()) - t0) // step + 1)
    demand: dict[int, list[float]] = {k: [0.0] * slots for k in cold}
    for key_id, start, n in DemandBucket.objects.filter(
        key_id__in=list(cold), seconds=step, start__gte=since, start__lt=until
    ).values_list("key_id", "start", "requests"):
        i = (int(start.timestamp()) - t0) // step
        if 0 <= i < slots:
            demand[key_id][i] += n
    out = {}
    for key_id, by_start in cold.items():
        series = [0] * slots
        for start, n in by_start.items():
            i = (start - t0) // step
            if 0 <= i < slots:
                series[i] += n
        out[key_id] = m.speculable(series, demand[key_id], lead)
    return out


def misses_summary(qs: QuerySet, since: datetime, until: datetime) -> dict:
    """The window's reasons and rates; ``qs`` is MissBucket, already filtered (FilterSet)."""
    qs = qs.filter(start__gte=since, start__lt=until)
    sums = {f"s_{c}": Sum(c) for c in MISS_COUNTERS}
    agg = qs.aggregate(**sums)
    total = {c: agg[f"s_{c}"] or 0 for c in MISS_COUNTERS}
    spec_by_key = _speculable(qs, since, until)
    tenant_of = dict(qs.values_list("key_id", "key__tenant").distinct())  # only keys in the window
    spec_by_tenant: dict[str, int] = defaultdict(int)
    for key_id, n in spec_by_key.items():
        spec_by_tenant[tenant_of.get(key_id, "")] += n
    by_tenant = []
    for row in qs.values("key__tenant").annotate(**sums).order_by("key__tenant"):
        c = {k: row[f"s_{k}"] or 0 for k in MISS_COUNTERS}
        tenant = row["key__tenant"]
        spec = spec_by_tenant.get(tenant, 0)
        rates = _rates(c)
        by_tenant.append(
            {
                "tenant": tenant,
                **rates,
                "speculable_misses": spec,
                "speculable_share": spec / rates["misses"] if rates["misses"] else None,
            }
        )
    by_tenant.sort(key=lambda t: (-t["requests"], t["tenant"]))
    by_engine = []
    for row in (
        qs.values("engine_id", "engine__engine_id", "engine__node__name")
        .annotate(**sums)
        .order_by("engine__node__name", "engine__engine_id")
    ):
        c = {k: row[f"s_{k}"] or 0 for k in MISS_COUNTERS}
        predicted = c["predicted_records"]
        by_engine.append(
            {
                "engine": row["engine_id"],
                "engine_name": f"{row['engine__node__name']}/{row['engine__engine_id']}",
                **_rates(c),
                "predicted_records": predicted,
                "predicted_cached_tokens": c["predicted_cached_tokens"] if predicted else None,
                "delivered_cached_tokens": c["predicted_delivered_tokens"] if predicted else None,
                "routed_minus_delivered_tokens": (
                    c["predicted_cached_tokens"] - c["predicted_delivered_tokens"]
                    if predicted
                    else None
                ),
            }
        )
    spec_total = sum(spec_by_key.values())
    totals = _rates(total)
    board = scoreboard(since, until)
    return {
        "window": {
            "since": since.isoformat(),
            "until": until.isoformat(),
            "bucket_seconds": settings.PREWARM_DEMAND_BUCKET_SECONDS,
        },
        "totals": {
            **totals,
            "speculable_misses": spec_total,
            "speculable_share": spec_total / totals["misses"] if totals["misses"] else None,
        },
        "by_tenant": by_tenant,
        "by_engine": by_engine,
        "series": _series(qs, [t["tenant"] for t in by_tenant]),
        "verdict": {
            "verdict": board["recommendation"]["verdict"],
            "text": board["recommendation"].get("text", ""),
        },
    }


def _series(qs: QuerySet, tenants: list[str]) -> dict:
    """Reasons per bucket per tenant (the first SERIES_TENANTS; the rest summed as 'other')."""
    shown = set(tenants[:SERIES_TENANTS])
    starts: set[datetime] = set()
    cells: dict[str, dict[datetime, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(int))
    )
    rows = qs.values("key__tenant", "start").annotate(**{f"s_{r}": Sum(r) for r in m.REASONS})
    for row in rows:
        tenant = row["key__tenant"] if row["key__tenant"] in shown else OTHER_TENANTS
        starts.add(row["start"])
        for r in m.REASONS:
            cells[tenant][row["start"]][r] += row[f"s_{r}"] or 0
    at = sorted(starts)
    order = [t for t in tenants if t in cells] + (
        [OTHER_TENANTS] if OTHER_TENANTS in cells and OTHER_TENANTS not in shown else []
    )
    return {
        "at": [a.isoformat() for a in at],
        "tenants": [
            {"tenant": t, **{r: [cells[t][a][r] for a in at] for r in m.REASONS}} for t in order
        ],
    }


def top_tenants(since: datetime, n: int) -> tuple[list[dict], dict]:
    """The ``n`` tenants with most served requests since ``since``, and the rest summed (the
    Prometheus series: bounded tenant cardinality)."""
    sums = {f"s_{c}": Sum(c) for c in MISS_COUNTERS}
    rows = []
    for row in MissBucket.objects.filter(start__gte=since).values("key__tenant").annotate(**sums):
        c = {k: row[f"s_{k}"] or 0 for k in MISS_COUNTERS}
        rows.append((row["key__tenant"], c))
    rows.sort(key=lambda tc: (-sum(tc[1][r] for r in m.REASONS), tc[0]))
    rest: dict[str, int] = defaultdict(int)
    for _, c in rows[n:]:
        for k, v in c.items():
            rest[k] += v
    return [{"tenant": t, **c} for t, c in rows[:n]], dict(rest)


WINDOWS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
}
