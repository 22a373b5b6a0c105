"""Scores of speculative replicas, and the scoreboard that aggregates them.

Per replica (real or shadow), over the time it was held, ``[placed_at, end)`` with ``end`` the
first of eviction, expiry and now:
- ``requests``: requests of its workload key in that time, from the demand buckets (each bucket
  counted pro rata to its overlap with the hold);
- ``hits = floor(requests / holders)``: its share of them, where ``holders`` is the number of
  engines holding the whole prefix on GPU when scored (a shadow replica counts itself in too), as
  a cache-aware router spreads a prefix's requests over its holders;
- ``tokens_hit = hits x prefix tokens``; ``ttft_saved_s = hits x`` the cost model's prefill
  time of the prefix (what each hit did not recompute);
- ``vram_byte_seconds = bytes x held seconds``; ``bytes_moved = bytes`` (what the copy moved,
  or would have moved in shadow mode).
``precision`` = replicas with at least one hit / replicas. A replica is final once scored one
bucket after its hold ended; until then each scoring pass recomputes it from scratch.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Count, FloatField, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane.core import blockhash
from controlplane.demand.models import DemandBucket
from controlplane.fleet.residency import get_index

from .models import SpeculativeReplica

LOOKBACK = timedelta(days=2)
MIN_SCORED_REPLICAS = 20  # below this the scoreboard makes no recommendation
GOOD_PRECISION = 0.5


def _requests_during(key_id: int | None, start, end) -> float:
    if key_id is None or end <= start:
        return 0.0
    total = 0.0
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    for b_start, seconds, n in DemandBucket.objects.filter(
            key_id=key_id, start__lt=end, start__gte=start - timedelta(seconds=bucket_s)) \
            .values_list("start", "seconds", "requests"):
        b_end = b_start + timedelta(seconds=seconds)
        overlap = (min(b_end, end) - max(b_start, start)).total_seconds()
        if overlap > 0:
            total += n * overlap / seconds
    return total


def score_replica(r: SpeculativeReplica, now) -> None:
    from .planning import cost_model_for

    end = min(x for x in (now, r.evicted_at, r.expires_at) if x is not None)
    held_s = max(0.0, (end - r.placed_at).total_seconds())
    requests = _requests_during(r.workload_key_id, r.placed_at, end)
    chain = [blockhash.from_hex(k) for k in r.prefix_keys]
    holders = {h.engine for h in get_index().holders(chain, limit=256)
               if h.depth == len(chain) and h.tier == "GPU"}
    if r.shadow:
        holders.add(r.engine_id)
    hits = int(math.floor(requests / max(1, len(holders))))
    tokens = len(chain) * r.engine.block_size
    cm = cost_model_for(r.engine.model)
    r.hits, r.tokens_hit = hits, hits * tokens
    r.ttft_saved_s = hits * (cm.prefill_seconds(tokens) - cm.batch_overhead_s)
    r.vram_byte_seconds = r.bytes * held_s
    r.scored_at = now


def score_all(now=None) -> int:
    """Score every replica whose score can still change; returns how many were scored."""
    now = now or timezone.now()
    final_after = timedelta(seconds=settings.PREWARM_DEMAND_BUCKET_SECONDS)
    todo = SpeculativeReplica.objects.select_related("engine").filter(placed_at__gte=now - LOOKBACK)
    changed = []
    for r in todo:
        end = min(x for x in (r.evicted_at, r.expires_at) if x is not None)
        if r.scored_at is not None and r.scored_at >= end + final_after:
            continue  # final
        score_replica(r, now)
        changed.append(r)
    SpeculativeReplica.objects.bulk_update(
        changed, ["hits", "tokens_hit", "ttft_saved_s", "vram_byte_seconds", "scored_at"], batch_size=2000)
    return len(changed)


# -- scoreboard --------------------------------------------------------------------------------
def _metrics(qs) -> dict:
    agg = qs.aggregate(
        replicas=Count("id"), hit=Count("id", filter=Q(hits__gt=0)), hits=Coalesce(Sum("hits"), 0),
        bytes_moved=Coalesce(Sum("bytes"), 0),
        vram=Coalesce(Sum("vram_byte_seconds"), 0.0, output_field=FloatField()),
        ttft=Coalesce(Sum("ttft_saved_s"), 0.0, output_field=FloatField()))
    return _shape(agg)


def _shape(agg: dict) -> dict:
    n = agg["replicas"]
    return {"replicas": n, "hits": int(agg["hits"]), "precision": round(agg["hit"] / n, 4) if n else None,
            "bytes_moved": int(agg["bytes_moved"]), "vram_byte_seconds": float(agg["vram"]),
            "ttft_saved_s": round(float(agg["ttft"]), 4)}


def _grouped(qs, field: str) -> list[tuple[dict, dict]]:
    rows = qs.values(*field).annotate(
        replicas=Count("id"), hit=Count("id", filter=Q(hits__gt=0)), hits=Coalesce(Sum("hits"), 0),
        bytes_moved=Coalesce(Sum("bytes"), 0),
        vram=Coalesce(Sum("vram_byte_seconds"), 0.0, output_field=FloatField()),
        ttft=Coalesce(Sum("ttft_saved_s"), 0.0, output_field=FloatField())).order_by(*field)
    return [({f: r[f] for f in field}, _shape(r)) for r in rows]


def load_sweep_map() -> tuple[dict | None, str]:
    """The simulator's sweep map (where speculation pays), or None and why it is missing."""
    path = Path(settings.PREWARM_SWEEP_MAP or settings.DATA_DIR / "sim" / "sweep.json")
    if not path.exists():
        return None, f"the simulator's sweep map is missing ({path} not found; run the sim sweep)"
    try:
        return json.loads(path.read_text()), f"sweep map from {path}"
    except (OSError, ValueError) as exc:
        return None, f"the simulator's sweep map at {path} is unreadable: {exc}"


def recommendation(totals: dict, shadow: dict, tenants: list[dict]) -> dict:
    sweep, sweep_note = load_sweep_map()
    n = totals["replicas"] + shadow["replicas"]
    link = settings.PREWARM_LINK_BYTES_PER_S
    benefit = [t["tenant"] for t in tenants
               if t["precision"] is not None and t["precision"] >= GOOD_PRECISION
               and t["ttft_saved_s"] > t["bytes_moved"] / link]
    if sweep and isinstance(sweep, dict) and sweep.get("summary"):
        sweep_note += f": {sweep['summary']}"
    if n < MIN_SCORED_REPLICAS:
        return {"verdict": "insufficient_data", "tenants_that_benefit": benefit,
                "text": f"Only {n} speculative replicas scored so far (at least {MIN_SCORED_REPLICAS} "
                        f"are needed for a verdict); {sweep_note}."}
    scored = totals if totals["replicas"] else shadow
    copy_s = scored["bytes_moved"] / link
    pays = (scored["precision"] or 0) >= GOOD_PRECISION and scored["ttft_saved_s"] > copy_s
    which = "executed" if totals["replicas"] else "shadow"
    text = (f"{which.capitalize()} replicas saved an estimated {scored['ttft_saved_s']:.1f} s of prefill "
            f"for {copy_s:.1f} s of link time at precision {scored['precision'] or 0:.2f}: "
            + ("speculation pays here" if pays else "reactive replication is enough here")
            + (f", most for {', '.join(benefit[:5])}" if pays and benefit else "") + f"; {sweep_note}.")
    return {"verdict": "speculation_pays" if pays else "reactive_enough", "text": text,
            "tenants_that_benefit": benefit}


def scoreboard(since, until) -> dict:
    qs = SpeculativeReplica.objects.filter(placed_at__gte=since, placed_at__lt=until)
    real, shadow = qs.filter(shadow=False), qs.filter(shadow=True)
    by_policy = [{"policy": k["item__plan__policy__name"], "mode": k["item__plan__mode"], **m}
                 for k, m in _grouped(qs.filter(item__isnull=False), ("item__plan__policy__name", "item__plan__mode"))]
    by_forecaster = [{"forecaster": k["forecaster"] or "unknown", **m} for k, m in _grouped(qs, ("forecaster",))]
    tenants = [{"tenant": k["workload_key__tenant"] or "unknown", **m}
               for k, m in _grouped(qs, ("workload_key__tenant",))]
    totals, shadow_totals = _metrics(real), _metrics(shadow)
    return {"window": {"since": since.isoformat(), "until": until.isoformat()},
            "totals": totals, "shadow_totals": shadow_totals, "by_policy": by_policy,
            "by_forecaster": by_forecaster, "by_tenant": tenants,
            "recommendation": recommendation(totals, shadow_totals, tenants)}

