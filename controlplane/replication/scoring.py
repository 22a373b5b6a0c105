"""Scores of speculative replicas (the scoreboard that aggregates them is `scoreboard.py`).

Per replica (real or shadow), over the time it was held, ``[placed_at, end)`` with ``end`` the
first of eviction (or loss), expiry and now:
- **measured hits**, where gateways' request records name the serving engine and its cached
  tokens (``engine``, ``cached_tokens``; counted at ingest, ``demand.services``): a hit is a
  request of its key served by its engine during the hold whose cached tokens covered its
  prefix (``served_hits``). ``hits_measured`` is then true.
- **estimated hits** otherwise (records without those fields, and shadow replicas, which were
  never placed): ``requests`` = its key's requests in the hold from the demand buckets (pro
  rata), ``hits = floor(requests / holders)``, its share under cache-aware routing, where
  ``holders`` is the number of engines holding the whole prefix on GPU when scored (a shadow
  replica counts itself in too).
- A copy its engine never confirmed (``unconfirmed``) was never held: no hits, nothing held.
- ``tokens_hit = hits x prefix tokens``; ``ttft_saved_s = hits x`` the cost model's prefill
  time of the prefix (what each hit did not recompute: a model figure either way);
- ``vram_byte_seconds = bytes x held seconds`` for GPU-tier replicas only; host-memory (CPU
  tier, e.g. LMCache's) replicas count in ``host_byte_seconds`` instead; bytes moved are what
  the executor reported (``bytes_moved``; shadow replicas: what they would have moved).
``precision`` = replicas with at least one hit / replicas. A replica is final once scored one
bucket after its hold ended; until then each scoring pass recomputes it from scratch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import F, Sum
from django.utils import timezone

from controlplane.core import blockhash
from controlplane.demand.models import DemandBucket
from controlplane.fleet.residency import get_index

from .choices import StorageTier
from .models import SpeculativeReplica
from .plans.costs import cost_model_for

LOOKBACK = timedelta(days=2)


def _requests_during(key_id: int | None, start, end) -> float:
    if key_id is None or end <= start:
        return 0.0
    total = 0.0
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    for b_start, seconds, n in DemandBucket.objects.filter(
        key_id=key_id, start__lt=end, start__gte=start - timedelta(seconds=bucket_s)
    ).values_list("start", "seconds", "requests"):
        b_end = b_start + timedelta(seconds=seconds)
        overlap = (min(b_end, end) - max(b_start, start)).total_seconds()
        if overlap > 0:
            total += n * overlap / seconds
    return total


def _served_records_during(key_id: int | None, start, end) -> int:
    """Records of the key in the hold that named their serving engine and cached tokens."""
    if key_id is None or end <= start:
        return 0
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    return (
        DemandBucket.objects.filter(
            key_id=key_id, start__lt=end, start__gte=start - timedelta(seconds=bucket_s)
        ).aggregate(n=Sum("served_records"))["n"]
        or 0
    )


def score_replica(r: SpeculativeReplica, now) -> None:
    end = min(x for x in (now, r.evicted_at, r.expires_at) if x is not None)
    never_held = not r.shadow and r.confirmed_at is None
    held_s = 0.0 if never_held else max(0.0, (end - r.placed_at).total_seconds())
    chain = [blockhash.from_hex(k) for k in r.prefix_keys]
    measured = not r.shadow and _served_records_during(r.workload_key_id, r.placed_at, end) > 0
    if never_held:
        hits = 0
    elif measured:
        hits = r.served_hits
    else:
        requests = _requests_during(r.workload_key_id, r.placed_at, end)
        holders = {
            h.engine
            for h in get_index().holders(chain, limit=256)
            if h.depth == len(chain) and h.tier == StorageTier.GPU
        }
        if r.shadow:
            holders.add(r.engine_id)
        hits = int(math.floor(requests / max(1, len(holders))))
    tokens = len(chain) * r.engine.block_size
    cm = cost_model_for(r.engine.model)
    r.hits, r.tokens_hit, r.hits_measured = hits, hits * tokens, measured
    r.ttft_saved_s = hits * (cm.prefill_seconds(tokens) - cm.batch_overhead_s)
    on_gpu = r.tier == StorageTier.GPU
    r.vram_byte_seconds = r.bytes * held_s if on_gpu else 0.0
    r.host_byte_seconds = 0.0 if on_gpu else r.bytes * held_s
    r.scored_at = now


def score_all(now=None) -> int:
    """Score every replica whose score can still change; returns how many were scored."""
    now = now or timezone.now()
    final_after = timedelta(seconds=settings.PREWARM_DEMAND_BUCKET_SECONDS)
    unscored = SpeculativeReplica.objects.select_related("engine").filter(
        placed_at__gte=now - LOOKBACK
    )
    changed = []
    for r in unscored:
        end = min(x for x in (r.evicted_at, r.expires_at) if x is not None)
        if r.scored_at is not None and r.scored_at >= end + final_after:
            continue  # final
        score_replica(r, now)
        changed.append(r)
    SpeculativeReplica.objects.bulk_update(
        changed,
        [
            "hits",
            "tokens_hit",
            "hits_measured",
            "ttft_saved_s",
            "vram_byte_seconds",
            "host_byte_seconds",
            "scored_at",
        ],
        batch_size=2000,
    )
    return len(changed)


def credit_served(served: list[tuple[int, int, float, int]], **_signal) -> int:
    """Requests served by a speculative replica's engine during its hold: each one counts for
    the replica, and is a hit when its cached tokens cover the replica's prefix.
    ``served`` rows: (workload key id, engine id, unix time, cached tokens). Connected to
    ``demand.signals.requests_served`` (demand's ingest of request records)."""
    if not served:
        return 0
    t0 = datetime.fromtimestamp(min(r[2] for r in served), tz=UTC)
    t1 = datetime.fromtimestamp(max(r[2] for r in served), tz=UTC)
    replicas = list(
        SpeculativeReplica.objects.filter(
            shadow=False,
            engine_id__in={r[1] for r in served},
            workload_key_id__in={r[0] for r in served},
            placed_at__lte=t1,
            expires_at__gt=t0,
            confirmed_at__isnull=False,
        ).values_list(
            "pk",
            "engine_id",
            "workload_key_id",
            "placed_at",
            "expires_at",
            "evicted_at",
            "prefix_keys",
            "engine__block_size",
        )
    )
    if not replicas:
        return 0
    by = defaultdict(list)
    for pk, engine, key, placed, expires, evicted, chain, bs in replicas:
        end = min(expires, evicted) if evicted else expires
        by[(key, engine)].append((pk, placed.timestamp(), end.timestamp(), len(chain) * bs))
    seen: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for key, engine, t, cached in served:
        for pk, start, end, tokens in by.get((key, engine), ()):
            if start <= t < end:
                seen[pk][0] += 1
                seen[pk][1] += cached >= tokens
    for pk, (n, hits) in seen.items():
        SpeculativeReplica.objects.filter(pk=pk).update(
            served_requests=F("served_requests") + n, served_hits=F("served_hits") + hits
        )
    return len(seen)
