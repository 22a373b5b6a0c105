"""Scores of speculative replicas (the scoreboard that aggregates them is `scoreboard.py`).

Three kinds of replica: **live** (a copy that landed), **held out** (the holdout's control arm:
approved, withheld at random, recorded with what it would have done) and **shadow** (a shadow
plan's, never executed). Each is scored over its hold, ``[placed_at, end)`` with ``end`` the
first of eviction (or loss), expiry and now:

Whose records count: a gateway sees every engine's requests, an agent's request tap only its own
engine's. So a gateway's records count for every measure below; an agent's only for the replicas
on its own engine, never for another engine's: one node cannot move another's replica scores.
The holdout's assignments are the exception: their measure is every request of the prefix on
any engine, and behind a router whose engines' taps post the records (vllm-router, llm-d) the
fleet's agents together report exactly those. Each agent's records were already refused at
ingest unless they name its own engine and a tenant its node serves (``prewarm/tenants``), so an
agent moves an assignment only with what its own engine served, for tenants it may serve; that
is the bound docs/security.md states.

- **Requests on the pair**: request records that name their serving engine
  (``engine``, ``cached_tokens``, optionally ``ttft_s``) are counted at ingest
  (``credit_served``, on ``demand.signals.requests_served``) for the one replica of their
  (key, engine) whose hold they fall in: requests, cached tokens, TTFT. A hit
  is a request on a confirmed live replica whose cached tokens cover the tokens it placed; a
  record never counts for two replicas. Records of the key that missed the replica's tokens
  (a gateway's on any engine, an agent's on the replica's) give the **miss TTFT**.
- **Requests on the key**: every request of the key during a live or held-out replica's hold,
  whatever engine served it (by a gateway's records; an agent's for the replica's engine),
  counted for one replica (``key_*``; the per-protocol view).
- **Requests of an assignment** (the holdout's measure, intention to treat): every request of
  the key in its draw's window, whatever engine served it and whoever reported it, the same rule
  on both arms (``credit_assignments``).
- **Hits**: measured where records name the replica's engine, or a gateway's name any engine
  (``hits_measured``); else (shadow replicas, records without the fields) **estimated from
  gateways' records** only (``hits_measured`` false): the key's gateway requests in the hold
  over the engines holding the prefix. Held-out replicas and copies never confirmed have none.
- **Credit, counterfactual**: without the replica, its engine would have computed the prefix on
  its first request and served the rest from its own cache, so a used replica is credited at
  most **one prefill** of the tokens it placed (``new_tokens``): the key's miss TTFT minus the
  pair's TTFT where records carry TTFT (``saving_basis = measured-ttft``), capped at the cost
  model's prefill of those tokens (the difference includes queueing), else that prefill
  (``cost-model``). More than that is only claimed by the holdout's
  measured uplift (scoreboard), never per replica.
- **Cost**: what placing it took (``cost_s``, ``cost_basis``): a warm-up's prefill of the tokens
  it placed on the target, a copy's bytes on the link (held-out and shadow replicas: what they
  would have taken).
- ``vram_byte_seconds = bytes x held seconds`` for GPU-tier replicas only; host-memory (CPU
  tier, e.g. LMCache's) replicas count in ``host_byte_seconds``; copies never confirmed and
  held-out replicas were never held: nothing.
``precision`` = replicas with at least one hit / replicas. A replica is final once scored one
bucket after its hold ended; until then each scoring pass recomputes it from scratch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import F, Q, Sum
from django.utils import timezone

from controlplane.demand.models import DemandBucket
from controlplane.fleet.configured_index import get_index
from wire import blockhash

from .choices import StorageTier, Transport
from .models import HoldoutDraw, SpeculativeReplica
from .plans.costs import cost_model_for, placement_cost, prefill_s

LOOKBACK = timedelta(days=2)
TTFT_SAMPLES = 200  # per replica, for the scoreboard's distributions
DRAW_SAMPLES = 500  # per assignment, for the holdout's distributions
MEASURED, MODELLED = "measured-ttft", "cost-model"


def _requests_during(key_id: int | None, start, end) -> float:
    if key_id is None or end <= start:
        return 0.0
    total = 0.0
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    # Gateways' requests only: an agent's tap speaks for its own engine, not for the key.
    for b_start, seconds, n in DemandBucket.objects.filter(
        key_id=key_id, start__lt=end, start__gte=start - timedelta(seconds=bucket_s)
    ).values_list("start", "seconds", "gateway_requests"):
        b_end = b_start + timedelta(seconds=seconds)
        overlap = (min(b_end, end) - max(b_start, start)).total_seconds()
        if overlap > 0:
            total += n * overlap / seconds
    return total


def _served_records_during(key_id: int | None, start, end) -> int:
    """Gateways' records of the key in the hold that named their serving engine and cached
    tokens."""
    if key_id is None or end <= start:
        return 0
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    return (
        DemandBucket.objects.filter(
            key_id=key_id, start__lt=end, start__gte=start - timedelta(seconds=bucket_s)
        ).aggregate(n=Sum("gateway_served_records"))["n"]
        or 0
    )


def _transport(r: SpeculativeReplica) -> str:
    if r.job_id and r.job is not None:
        return r.job.transport
    if r.item_id and r.item is not None:
        return r.item.plan.policy.default_transport
    return Transport.TCP


def score_replica(r: SpeculativeReplica, now) -> None:
    end = min(x for x in (now, r.evicted_at, r.expires_at) if x is not None)
    live = not r.shadow and not r.held_out
    never_held = r.held_out or (live and r.confirmed_at is None)
    held_s = 0.0 if never_held else max(0.0, (end - r.placed_at).total_seconds())
    chain = [blockhash.from_hex(k) for k in r.prefix_keys]
    full = len(chain) * r.engine.block_size
    tokens = r.tokens or full
    new = r.new_tokens or tokens
    measured = live and (
        r.served_requests > 0 or _served_records_during(r.workload_key_id, r.placed_at, end) > 0
    )
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
    cm = cost_model_for(r.engine.model)
    r.hits, r.tokens_hit, r.hits_measured = hits, hits * tokens, measured
    prefill = prefill_s(cm, tokens, tokens - new)
    if r.miss_ttft_n and r.served_ttft_n:
        # Misses' TTFT minus hits' includes queueing on whichever engines served them: credit
        # the replica no more than the one prefill it can have spared.
        measured_gap = r.miss_ttft_s / r.miss_ttft_n - r.served_ttft_s / r.served_ttft_n
        one, r.saving_basis = min(prefill, max(0.0, measured_gap)), MEASURED
    else:
        one, r.saving_basis = prefill, MODELLED
    r.ttft_saved_s = one if hits else 0.0  # at most one prefill per used replica
    nbytes = r.bytes if (r.shadow or r.held_out) else r.bytes_moved
    r.cost_s, r.cost_basis = placement_cost(_transport(r), nbytes, cm, tokens, tokens - new)
    on_gpu = r.tier == StorageTier.GPU
    r.vram_byte_seconds = r.bytes * held_s if on_gpu else 0.0
    r.host_byte_seconds = 0.0 if on_gpu else r.bytes * held_s
    r.scored_at = now


SCORED_FIELDS = [
    "hits",
    "tokens_hit",
    "hits_measured",
    "ttft_saved_s",
    "saving_basis",
    "cost_s",
    "cost_basis",
    "vram_byte_seconds",
    "host_byte_seconds",
    "scored_at",
]


def score_all(now=None) -> int:
    """Score every replica whose score can still change; returns how many were scored."""
    now = now or timezone.now()
    final_after = timedelta(seconds=settings.PREWARM_DEMAND_BUCKET_SECONDS)
    unscored = SpeculativeReplica.objects.select_related(
        "engine", "job", "item__plan__policy"
    ).filter(placed_at__gte=now - LOOKBACK)
    changed = []
    for r in unscored:
        end = min(x for x in (r.evicted_at, r.expires_at) if x is not None)
        if r.scored_at is not None and r.scored_at >= end + final_after:
            continue  # final
        score_replica(r, now)
        changed.append(r)
    SpeculativeReplica.objects.bulk_update(changed, SCORED_FIELDS, batch_size=2000)
    return len(changed)


def credit_served(served: list[tuple], **_signal) -> int:
    """Requests served during live or held-out replicas' holds, counted twice over:

    - **on the pair**: for the one replica of their (key, engine) whose hold they fall in (the
      earliest placed, if holds overlap): requests, cached tokens, TTFT; a hit where the replica
      was confirmed and the cached tokens cover what it placed. Requests of the key that missed
      a replica's tokens (on any engine) give it miss TTFTs.
    - **on the key** (the holdout's measure): for the one replica of their key, live or held out,
      whose hold they fall in, whatever engine served them: requests, covered requests, cached
      tokens, TTFT. Cache-aware routing never sends a request to a held-out pair's engine, so
      only the key's requests compare the two arms over the same kind of window.

    A record never counts for two replicas on either measure, and an agent's record counts only
    for replicas on the engine it names (``_counts_for``). ``served`` rows: (workload key id,
    engine id, unix time, cached tokens[, TTFT seconds or None[, from a gateway]]). Connected to
    ``demand.signals.requests_served`` (demand's ingest of request records)."""
    if not served:
        return 0
    t0 = datetime.fromtimestamp(min(r[2] for r in served), tz=UTC)
    t1 = datetime.fromtimestamp(max(r[2] for r in served), tz=UTC)
    credit_assignments(served, t0, t1)
    by_pair, by_key = _holds(served, t0, t1)
    if not by_key:
        return 0
    seen = _tally_served(served, by_pair, by_key)
    _write_tallies(seen)
    return len(seen)


def _holds(served: list[tuple], t0: datetime, t1: datetime) -> tuple[dict, dict]:
    """The live (confirmed) and held-out replicas of the served keys whose holds overlap
    ``t0``..``t1``, earliest placed first, by (key, engine) and by key: (pk, hold start, hold
    end, tokens placed, held out, engine)."""
    rows = (
        SpeculativeReplica.objects.filter(
            shadow=False,
            workload_key_id__in={r[0] for r in served},
            placed_at__lte=t1,
            expires_at__gt=t0,
        )
        .filter(Q(held_out=True) | Q(confirmed_at__isnull=False))
        .order_by("placed_at", "pk")
        .values_list(
            "pk",
            "engine_id",
            "workload_key_id",
            "placed_at",
            "expires_at",
            "evicted_at",
            "prefix_keys",
            "engine__block_size",
            "tokens",
            "held_out",
        )
    )
    by_pair, by_key = defaultdict(list), defaultdict(list)
    for pk, engine, key, placed, expires, evicted, chain, bs, tokens, held_out in rows:
        end = min(expires, evicted) if evicted else expires
        row = (pk, placed.timestamp(), end.timestamp(), tokens or len(chain) * bs, held_out, engine)
        by_pair[(key, engine)].append(row)
        by_key[key].append(row)
    return by_pair, by_key


def _tally_served(served: list[tuple], by_pair: dict, by_key: dict) -> dict[int, _Tally]:
    """Each served record counted for its pair's replica and its key's (see ``credit_served``),
    and as a miss TTFT for the live replicas of its key whose tokens it did not cover."""
    seen: dict[int, _Tally] = defaultdict(_Tally)
    for rec in served:
        key, engine, t, cached = rec[:4]
        ttft = rec[4] if len(rec) > 4 else None
        mine = next((x for x in by_pair.get((key, engine), ()) if x[1] <= t < x[2]), None)
        if mine is not None:
            seen[mine[0]].pair.add(cached, cached >= mine[3], ttft)  # the same test on both arms
        during = [x for x in by_key.get(key, ()) if x[1] <= t < x[2] and _counts_for(rec, x[5])]
        if during:
            first = during[0]
            seen[first[0]].key.add(cached, cached >= first[3], ttft)
        if ttft is None:
            continue
        for pk, _start, _end, tokens, held_out, _engine in during:
            if cached < tokens and not held_out:
                seen[pk].miss_s += ttft
                seen[pk].miss_n += 1
    return seen


def _write_tallies(seen: dict[int, _Tally]) -> None:
    """Add each replica's tallies to its row (counters as increments, TTFT samples capped)."""
    for pk, tally in seen.items():
        p, k = tally.pair, tally.key
        SpeculativeReplica.objects.filter(pk=pk).update(
            **p.increments("served_"),
            **k.increments("key_"),
            miss_ttft_s=F("miss_ttft_s") + tally.miss_s,
            miss_ttft_n=F("miss_ttft_n") + tally.miss_n,
        )
        if p.samples or k.samples:
            r = SpeculativeReplica.objects.only("ttft_samples", "key_ttft_samples").get(pk=pk)
            r.ttft_samples = (r.ttft_samples + p.samples)[:TTFT_SAMPLES]
            r.key_ttft_samples = (r.key_ttft_samples + k.samples)[:TTFT_SAMPLES]
            r.save(update_fields=["ttft_samples", "key_ttft_samples"])


def credit_assignments(served: list[tuple], t0: datetime, t1: datetime) -> int:
    """The holdout's measure (intention to treat): each served record of a key counts for the
    one assignment of that key (``HoldoutDraw``, the earliest) whose window holds its time,
    whatever engine served it, whether a gateway or that engine's agent reported it, and
    whatever became of the assignment's copy. Both arms' windows follow one rule
    (``plans.holdout.window``), so they cover the same stretch of each burst. Counting an agent's
    records only for assignments on its own engine would measure a held-out prefix by the
    requests a cache-aware router sends to an engine that lacks it: almost none."""
    draws = list(
        HoldoutDraw.objects.filter(
            workload_key_id__in={r[0] for r in served},
            window_start__lte=t1,
            window_end__gt=t0,
        )
        .order_by("window_start", "pk")
        .values_list("pk", "workload_key_id", "window_start", "window_end", "tokens")
    )
    by_key: dict[int, list] = defaultdict(list)
    for pk, key, start, end, tokens in draws:
        by_key[key].append((pk, start.timestamp(), end.timestamp(), tokens))
    seen: dict[int, _Counts] = defaultdict(_Counts)
    for rec in served:
        key, _engine, t, cached = rec[:4]
        mine = next((d for d in by_key.get(key, ()) if d[1] <= t < d[2]), None)
        if mine is not None:
            seen[mine[0]].add(cached, cached >= mine[3], rec[4] if len(rec) > 4 else None)
    for pk, c in seen.items():
        HoldoutDraw.objects.filter(pk=pk).update(**c.increments(""))
        if c.samples:
            d = HoldoutDraw.objects.only("ttft_samples").get(pk=pk)
            d.ttft_samples = (d.ttft_samples + c.samples)[:DRAW_SAMPLES]
            d.save(update_fields=["ttft_samples"])
    return len(seen)


def _counts_for(rec: tuple, engine: int | None) -> bool:
    """Whether a served record counts for a replica or assignment on ``engine``: a gateway's
    always (it sees every engine), an agent's only for its own engine."""
    from_gateway = rec[5] if len(rec) > 5 else True
    return from_gateway or rec[1] == engine


@dataclass
class _Counts:
    n: int = 0
    hits: int = 0
    cached: int = 0
    ttft_s: float = 0.0
    ttft_n: int = 0
    samples: list = field(default_factory=list)

    def increments(self, prefix: str) -> dict:
        """These counts added to the replica's ``<prefix>requests``, ``hits``, ``cached_tokens``,
        ``ttft_s`` and ``ttft_n`` fields (``served_`` on the pair, ``key_`` on the key)."""
        counts = {
            "requests": self.n,
            "hits": self.hits,
            "cached_tokens": self.cached,
            "ttft_s": self.ttft_s,
            "ttft_n": self.ttft_n,
        }
        return {f"{prefix}{name}": F(f"{prefix}{name}") + v for name, v in counts.items()}

    def add(self, cached: int, covered: bool, ttft: float | None) -> None:
        self.n += 1
        self.hits += covered
        self.cached += cached
        if ttft is not None:
            self.ttft_s += ttft
            self.ttft_n += 1
            if len(self.samples) < TTFT_SAMPLES:
                self.samples.append(round(float(ttft), 4))


@dataclass
class _Tally:
    """One replica's share of a batch of served records: on its pair, on its key, and the
    key's requests that missed its tokens."""

    pair: _Counts = field(default_factory=_Counts)
    key: _Counts = field(default_factory=_Counts)
    miss_s: float = 0.0
    miss_n: int = 0
