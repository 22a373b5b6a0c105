"""Why a served request missed: the reason vocabulary and the pure classifier (no Django).

The demand app decides each served request's reason when its record is ingested
(``controlplane/demand/misses.py`` gathers the facts below from the residency index and the copies
in flight), and only the counts per workload key, engine and time bucket are kept.

A request's *prefix* is its workload key's shared chain (what the planner replicates); ``L`` is
its length in blocks and ``c`` the blocks its serving engine served from cache
(``cached_tokens // block_size``). The serving engine's own state before the request is what it
reported (``c``): the index at ingest time already holds what serving the request stored there.
In this order, the first that applies:

- ``hit``: ``c >= L``, the cached tokens cover the prefix.
- ``partial``: ``0 < c < L``, part of the prefix came from cache.
- ``warming``: nothing cached, and a copy of the prefix to the serving engine was in flight.
- ``evicted``: nothing cached, and the serving engine removed the prefix's first block within the
  index's removal window, at or before the request (plus the report lag).
- ``routed_away``: nothing cached, and another engine held the whole prefix.
- ``variant``: nothing cached, and another engine held only a leading part of the prefix (the
  request shares part of what is resident, then differs: a prompt variation).
- ``cold``: the prefix was resident on no engine.

The *speed-of-light* hit: the request would have been a hit on the engine holding the longest
prefix of it (``hit``, or another engine held the whole prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# -- the reason vocabulary (spelled once: the model's columns, the API, the metrics, the page) -
HIT = "hit"
PARTIAL = "partial"  # not-vocabulary: a miss reason (a hit on part of the prefix)
COLD = "cold"
ROUTED_AWAY = "routed_away"
EVICTED = "evicted"
WARMING = "warming"  # not-vocabulary: a miss reason (a copy to the engine in flight)
VARIANT = "variant"
REASONS = (HIT, PARTIAL, COLD, ROUTED_AWAY, EVICTED, WARMING, VARIANT)
MISSES = (COLD, ROUTED_AWAY, EVICTED, WARMING, VARIANT)  # nothing of the prefix from cache

# Speculation: a bucket of a key is a burst when its requests reach BURST_FACTOR x the key's
# usual (median) requests per bucket, and at least BURST_MIN_REQUESTS.
BURST_FACTOR = 2.0
BURST_MIN_REQUESTS = 3


@dataclass(frozen=True)
class Facts:
    """What the classifier needs about one served request, gathered at ingest."""

    prefix_blocks: int  # L: the workload key's shared chain, in blocks (>= 1)
    cached_blocks: int  # c: blocks the serving engine served from cache
    others_depth: int = 0  # the longest leading part of the prefix another engine held
    warming: bool = False  # a copy of the prefix to the serving engine was in flight
    evicted: bool = False  # the serving engine removed the prefix's first block recently


def classify(f: Facts) -> str:
    """The request's reason (see the module docstring for the order)."""
    if f.cached_blocks >= f.prefix_blocks:
        return HIT
    if f.cached_blocks > 0:
        return PARTIAL
    if f.warming:
        return WARMING
    if f.evicted:
        return EVICTED
    if f.others_depth >= f.prefix_blocks:
        return ROUTED_AWAY
    if f.others_depth > 0:
        return VARIANT
    return COLD


def speed_of_light_hit(f: Facts) -> bool:
    """A hit had the request gone to the engine holding its longest prefix."""
    return f.cached_blocks >= f.prefix_blocks or f.others_depth >= f.prefix_blocks


def speed_of_light_blocks(f: Facts) -> int:
    """Blocks of the prefix the request would have had from cache at the speed of light."""
    return min(f.prefix_blocks, max(f.cached_blocks, f.others_depth))


def removed_in_window(removed_at: float | None, t: float, window_s: float, lag_s: float) -> bool:
    """A removal kept by the index counts for a request at ``t`` when it happened in the window
    before it (``lag_s`` allows for the agent's report reaching the index after the request)."""
    return removed_at is not None and t - window_s <= removed_at <= t + lag_s


def in_flight_at(started: float, ended: float | None, t: float, lag_s: float) -> bool:
    """A copy was in flight at ``t``: started by then (within ``lag_s``), not yet landed."""
    return started <= t + lag_s and (ended is None or ended >= t)


def burst_starts(requests: Sequence[float]) -> list[bool]:
    """For a key's requests per bucket (empty buckets as 0), which buckets are bursts: at least
    BURST_FACTOR x the median bucket and at least BURST_MIN_REQUESTS."""
    if not requests:
        return []
    ordered = sorted(requests)
    median = ordered[len(ordered) // 2]
    floor = max(BURST_MIN_REQUESTS, BURST_FACTOR * median)
    return [n >= floor for n in requests]


def speculable(cold: Sequence[int], requests: Sequence[float], lead_buckets: int) -> int:
    """Cold misses speculation could have removed: those in a bucket of a burst of their key or
    in the ``lead_buckets`` buckets before one (a copy placed ahead would have served them)."""
    bursts = burst_starts(requests)
    total = 0
    for i, n in enumerate(cold):
        if n and any(bursts[i : i + lead_buckets + 1]):
            total += n
    return total
