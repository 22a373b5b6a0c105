"""Routers: pick the engine for a request.

``cache-aware`` minimises queueing plus prefill of the uncached part (and any promotion from a
lower tier that the queue does not hide), as Mooncake's Algorithm 1 does; the others ignore the
cache (their engines still reuse whatever they happen to hold).
"""

from __future__ import annotations

from controlplane.sim.workloads.base import BLOCK_TOKENS


def promotion_s(sim, lower) -> float:
    if not lower:
        return 0.0
    bb = sim.block_bytes
    return sum(k * bb / tier.bytes_per_s for tier, k in lower)


def _at(sim, e, t, keys):
    start = e.free_at if e.free_at > t else t
    m, lower = e.match(keys, start)
    return e, m, promotion_s(sim, lower), lower


def least_loaded(sim, i, t, keys):
    e = min(sim.serving, key=_free_at)
    return _at(sim, e, t, keys)


def _free_at(e):
    return e.free_at


def random_router(sim, i, t, keys):
    serving = sim.serving
    return _at(sim, serving[int(sim.rng.integers(len(serving)))], t, keys)


class RoundRobin:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, sim, i, t, keys):
        serving = sim.serving
        e = serving[self.n % len(serving)]
        self.n += 1
        return _at(sim, e, t, keys)


def cache_aware(sim, i, t, keys, matcher=None):
    """argmin over serving engines of wait + prefill(uncached) + unhidden promotion; engines
    ramping in after joining (``ClusterConfig.join_ramp_s``) win when the choice's queue is
    longer than theirs by more than ``ClusterConfig.balance_wait_s``."""
    B = BLOCK_TOKENS
    total = len(keys) * B + sim.suffixes[i]
    prefill = sim.prefill_s
    best = None
    best_cost = float("inf")
    floor = prefill(total - len(keys) * B, len(keys) * B)
    for e in sim.serving:
        wait = e.free_at - t if e.free_at > t else 0.0
        if wait + floor >= best_cost:
            continue
        if matcher is None:
            m, lower = e.match(keys, t + wait)
        else:
            m, lower = matcher(keys), []
        cached = m * B
        promo = 0.0
        if lower:
            cached += sum(k for _, k in lower) * B
            promo = promotion_s(sim, lower)
        cost = wait + prefill(total - cached, cached)
        if promo > wait:
            cost += promo - wait
        if cost < best_cost:
            best_cost = cost
            best = (e, m, promo, lower)
    guard = sim.config.balance_wait_s
    if guard != float("inf"):
        ramp = t - sim.config.join_ramp_s
        new = [e for e in sim.serving if e.serving_since > ramp]
        short = min(new, key=_free_at) if new else best[0]
        if best[0].free_at - max(short.free_at, t) > guard:
            if matcher is None:
                return _at(sim, short, t, keys)
            return short, matcher(keys), 0.0, []
    return best
