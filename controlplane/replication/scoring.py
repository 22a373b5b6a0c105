"""Scores of speculative replicas (the scoreboard that aggregates them is `scoreboard.py`).

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

import math
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.core import blockhash
from controlplane.demand.models import DemandBucket
from controlplane.fleet.residency import get_index

from .models import SpeculativeReplica

LOOKBACK = timedelta(days=2)


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
    unscored = SpeculativeReplica.objects.select_related("engine").filter(placed_at__gte=now - LOOKBACK)
    changed = []
    for r in unscored:
        end = min(x for x in (r.evicted_at, r.expires_at) if x is not None)
        if r.scored_at is not None and r.scored_at >= end + final_after:
            continue  # final
        score_replica(r, now)
        changed.append(r)
    SpeculativeReplica.objects.bulk_update(
        changed, ["hits", "tokens_hit", "ttft_saved_s", "vram_byte_seconds", "scored_at"], batch_size=2000)
    return len(changed)
