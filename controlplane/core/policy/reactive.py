"""The guarded reactive rule: hot-spot replication after a prefix turns hot.

Mooncake and Preble replicate a prefix once its holders are overloaded. To be a fair baseline
the rule is guarded: copy only when the holder's wait exceeds both ``threshold_s`` and twice the
copy time, never when the copy would land after the holder frees up anyway, and never while a
copy of the same prefix is in flight (so it cannot loop).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReactiveRule:
    threshold_s: float = 1.0  # holder wait that makes a prefix "hot"
    min_blocks: int = 2  # prefixes shorter than this are cheaper to recompute than to track

    def should_copy(self, holder_wait_s: float, copy_s: float, in_flight: bool) -> bool:
        if in_flight or copy_s <= 0:
            return False
        return holder_wait_s > self.threshold_s and holder_wait_s > 2.0 * copy_s


def queue_fallback(
    rule: ReactiveRule, *, holder_waits_s: list[float], other_waits_s: list[float], copy_s: float
) -> bool:
    """``predictive``'s fallback at the ingest re-plan, live and simulated: re-plan a prefix whose
    busiest holder queues past the reactive rule against the least-queued other engine (the wait
    a copy there would save, over the threshold and over twice the copy). Re-planned, not copied:
    the planner decides what to place, within the storm bound."""
    if not holder_waits_s or not other_waits_s:
        return False
    return rule.should_copy(max(holder_waits_s) - min(other_waits_s), copy_s, in_flight=False)


# Mooncake Store's dynamic hot-replica fanout (merged August 2026, off by default), with its
# defaults: a key whose requests over the last HOT_WINDOW_S reach HOT_ADMIT_QPS is hot, and a
# hot key is fanned out to other engines' memory until it has HOT_MAX_REPLICAS memory replicas.
HOT_WINDOW_S = 10.0
HOT_ADMIT_QPS = 0.8
HOT_MAX_REPLICAS = 2


def holders_capacity(*, holders: int, load: float, service_s: float) -> float:
    """Requests/s of a prefix its holders can take: their spare capacity over its service time
    (a prefix held nowhere counts one engine, where it is computed)."""
    if service_s <= 0:
        return float("inf")
    return max(1, holders) * max(0.0, 1.0 - load) / service_s


def exceeds_holders(*, rate: float, holders: int, load: float, service_s: float) -> bool:
    """Measured demand outruns the prefix's holders: what makes a prefix hot for the reactive
    strategy, and what a burst's onset must show before it re-plans the prefix."""
    return rate > holders_capacity(holders=holders, load=load, service_s=service_s)


def hot_fanout(*, recent_requests: int, holders: int, copies_in_flight: int) -> bool:
    """Mooncake's fanout: hot (HOT_ADMIT_QPS over HOT_WINDOW_S) and under HOT_MAX_REPLICAS."""
    if recent_requests < HOT_ADMIT_QPS * HOT_WINDOW_S or holders == 0:
        return False
    return holders + copies_in_flight < HOT_MAX_REPLICAS
