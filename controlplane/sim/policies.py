"""The policies a run compares: four routers, and replication policies on top of ``cache-aware``
routing (``routing-reactive``, ``reactive-naive``, ``hot-fanout``, ``everywhere``; the shared
policy's ``reactive``, ``predictive`` and ``clairvoyant`` build on them in ``planned.py``). ``everywhere`` is the ceiling placement policies are measured
against; ``clairvoyant`` (the planner fed the true arrivals) is a reference, not a bound.

``routing-reactive`` is the routing-time baseline: the guarded hot-spot copy (``ReactiveRule``) that also counts
what its copy displaces. A copy takes free blocks and cached blocks no queued or running request
references, cheapest first by their expected value over the horizon (recent rate of the block's
prefix x its recompute per block, shared among the prefix's holders), and is made only when the
value it displaces is below its own expected saving (the requests it will serve in the horizon,
each saving the holder's extra wait, at most a recompute). So it cannot evict another tenant's
hot, only copy, which is what made the old rule storm. ``reactive-naive`` is the old guarded
rule (a copy takes whatever room LRU gives it), kept for comparison.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from controlplane.core.policy.reactive import (
    HOT_ADMIT_QPS,
    HOT_WINDOW_S,
    ReactiveRule,
    hot_fanout,
)
from controlplane.core.prefix_cache import leading_match
from controlplane.sim import routers
from controlplane.sim.engine import GONE
from controlplane.sim.workloads.base import BLOCK_TOKENS

# The routing-time rule (``Reactive``): a baseline named for what it is, beside ``hot-fanout``;
# ``reactive`` is the strategy Prewarm ships (``planned.PlannedPolicy``).
ROUTING_REACTIVE = "routing-reactive"

POLICIES = (
    "random",
    "round-robin",
    "least-loaded",
    "cache-aware",
    "reactive",
    ROUTING_REACTIVE,
    "reactive-naive",
    "predictive",
    "clairvoyant",
    "everywhere",
    "hot-fanout",
)

# Mooncake Store's dynamic hot-replica fanout: its defaults live with the shared policy.


class RoutingPolicy:
    """Routing plus, optionally, replication. Subclasses override the hooks they need."""

    name = "cache-aware"
    tick_s = 0.0
    before_route: Callable[..., Any] | None = None  # (sim, i, t, pid, keys) -> None

    def __init__(self, router=routers.cache_aware) -> None:
        self.router = router

    def setup(self, sim) -> None:
        pass

    def route(self, sim, i, t, keys):
        return self.router(sim, i, t, keys)

    def use(self, sim, e, chain, t):
        return e.cache.use(chain, t)

    def on_tick(self, sim, t) -> None:
        pass


VALUE_HORIZON_S = 120.0  # horizon over which a block's expected value is counted


class Reactive(RoutingPolicy):
    """Cache-aware routing plus the guarded hot-spot copy (``ReactiveRule``); see module doc."""

    name = ROUTING_REACTIVE

    def __init__(self, rule: ReactiveRule | None = None, naive: bool = False) -> None:
        super().__init__()
        self.rule = rule or ReactiveRule()
        self.naive = naive
        if naive:
            self.name = "reactive-naive"
        self.before_route = self._maybe_copy
        self._seen: dict[int, tuple[float, float]] = {}  # pid -> (decayed count, as of t)
        self._rec: dict[int, float] = {}  # pid -> recompute seconds per block
        self._key_pid: dict[int, int] | None = None

    # -- what a block is worth --------------------------------------------------------------
    def observed_rate(self, pid: int, t: float) -> float:
        """Recent arrivals/s of ``pid`` (decayed over ``VALUE_HORIZON_S``)."""
        n, t0 = self._seen.get(pid, (0.0, t))
        return n * math.exp(-(t - t0) / VALUE_HORIZON_S) / VALUE_HORIZON_S

    def _count(self, pid: int, t: float) -> None:
        n, t0 = self._seen.get(pid, (0.0, t))
        self._seen[pid] = (n * math.exp(-(t - t0) / VALUE_HORIZON_S) + 1.0, t)

    def recompute_per_block(self, sim, pid: int, keys=None) -> float:
        r = self._rec.get(pid)
        if r is None:
            keys = keys if keys is not None else sim.workload.prefixes[pid]
            tokens = len(keys) * BLOCK_TOKENS
            wl = sim.workload
            suffix = float(wl.suffix_tokens.mean()) if len(wl) else 0.0
            r = (sim.prefill_s(suffix + tokens, 0.0) - sim.prefill_s(suffix, tokens)) / max(
                1, len(keys)
            )
            self._rec[pid] = r
        return r

    def rate_of(self, pid: int, t: float) -> float:
        """The demand rate a block's value is counted at (predictive: its forecast)."""
        return self.observed_rate(pid, t)

    def value_fn(self, sim, t: float, target=None):
        """Expected prefill seconds each cached block saves over the horizon on one holder:
        rate x horizon / holders x recompute per block (0 for a request's own blocks). With a
        ``target`` engine (the reactive rule, which has no forecast), blocks it used within the
        horizon are kept whatever their rate says (a bursty tenant idle for a minute is not
        cold)."""
        if self._key_pid is None:
            self._key_pid = {k: pid for pid, keys in enumerate(sim.workload.prefixes) for k in keys}
        key_pid = self._key_pid
        memo: dict[int, float] = {}
        serving = sim.serving
        prefixes = sim.workload.prefixes

        recent = t - VALUE_HORIZON_S
        blocks = target.cache.blocks if target is not None else None

        def value_of(k: int) -> float:
            if blocks is not None and blocks.get(k, -math.inf) > recent:
                return math.inf
            pid = key_pid.get(k)
            if pid is None:
                return 0.0
            v = memo.get(pid)
            if v is None:
                root = prefixes[pid][0]
                holders = sum(1 for e in serving if root in e.cache.blocks)
                v = (
                    self.rate_of(pid, t)
                    * VALUE_HORIZON_S
                    / max(1, holders)
                    * self.recompute_per_block(sim, pid)
                )
                memo[pid] = v
            return v

        return value_of

    # -- the rule ----------------------------------------------------------------------------
    def _maybe_copy(self, sim, i, t, pid, keys) -> None:
        rule = self.rule
        self._count(pid, t)
        if len(keys) < rule.min_blocks:
            return
        holder, best_m, hwait = None, 0, 0.0
        for e in sim.serving:
            m = e.cache.match(keys)
            if m > best_m or (
                m == best_m and m and holder is not None and e.free_at < holder.free_at
            ):
                holder, best_m = e, m
        if holder is None or best_m < rule.min_blocks:
            return
        hwait = holder.wait(t)
        if hwait <= rule.threshold_s:
            return
        target, twait = None, hwait
        for e in sim.serving:
            if e is holder or (pid, e.eid) in sim.in_flight:
                continue
            w = e.wait(t)
            if w < twait and e.cache.match(keys) < best_m:
                target, twait = e, w
        if target is None:
            return
        chain = keys[:best_m]
        missing = best_m - target.cache.match(chain)
        land = sim.copy_eta(holder, target, missing * sim.block_bytes, t, speculative=False)
        # The loop guard counts this rule's own copies: a planned copy of the prefix to another
        # engine must not hold back the fallback (it may be slow, or paused behind demand).
        busy = sim.demand_in_flight
        in_flight = any(k[0] == pid for k in busy) if busy else False
        # Copy only if it lands before the holder frees up (land - t < hwait, implied by 2x).
        if not rule.should_copy(hwait, land - t, in_flight):
            return
        if self.naive:
            land = sim.start_copy(pid, chain, holder, target, t, speculative=False)
            self._copied(sim, pid, holder, target, t, land)
            return
        # The fair rule: what the copy saves (its share of the prefix's requests in the
        # horizon, each saving the holder's extra wait, at most a recompute) against what it
        # displaces (start_copy refuses room worth more than that).
        holders = sum(1 for e in sim.serving if e.cache.match(chain) == best_m)
        spill = max(1.0, self.observed_rate(pid, t) * VALUE_HORIZON_S / (holders + 1))
        per_request = min(hwait - twait, self.recompute_per_block(sim, pid, keys) * best_m)
        saving = spill * max(0.0, per_request)
        if saving > 0:
            land = sim.start_copy(
                pid,
                chain,
                holder,
                target,
                t,
                speculative=False,
                value_of=self.value_fn(sim, t, target),
                budget=saving,
            )
            self._copied(sim, pid, holder, target, t, land)

    def _copied(self, sim, pid: int, src, dst, t: float, land: float | None) -> None:
        """A copy this rule started (``land``: when it lands; None: not started). A hook: the
        planned policies' harm guard watches it."""


class HotFanout(Reactive):
    """``hot-fanout``: Mooncake Store's dynamic hot-replica fanout as a reactive baseline.

    On each arrival the prefix's requests over the last ``HOT_WINDOW_S`` are counted; at
    ``HOT_ADMIT_QPS`` or more it is hot, and while fewer than ``HOT_MAX_REPLICAS`` serving
    engines hold it in HBM (the original counts as one memory replica) one copy goes from a
    holder to the serving engine with the shortest queue, at on-demand priority, taking room as
    the fair reactive rule does (free, then unreferenced blocks worth less than the copy's
    expected saving). No queue threshold: heat alone admits a key, as in the store."""

    name = "hot-fanout"

    def __init__(self) -> None:
        super().__init__()
        self.before_route = self._fanout
        self._recent: dict[int, deque] = {}

    def _fanout(self, sim, i, t, pid, keys) -> None:
        self._count(pid, t)
        q = self._recent.setdefault(pid, deque())
        q.append(t)
        while q and q[0] <= t - HOT_WINDOW_S:
            q.popleft()
        if len(q) < HOT_ADMIT_QPS * HOT_WINDOW_S or len(keys) < self.rule.min_blocks:
            return
        holders = [e for e in sim.serving if e.cache.match(keys) == len(keys)]
        copies = sum(1 for k in sim.in_flight if k[0] == pid)
        if not hot_fanout(recent_requests=len(q), holders=len(holders), copies_in_flight=copies):
            return
        src = min(holders, key=lambda e: (e.link_free_at, e.eid))
        others = [e for e in sim.serving if e not in holders and (pid, e.eid) not in sim.in_flight]
        if not others:
            return
        dst = min(others, key=lambda e: (e.free_at, e.eid))
        rate = len(q) / HOT_WINDOW_S
        saving = (
            rate
            * VALUE_HORIZON_S
            / (len(holders) + 1)
            * self.recompute_per_block(sim, pid, keys)
            * len(keys)
        )
        sim.start_copy(
            pid,
            keys,
            src,
            dst,
            t,
            speculative=False,
            value_of=self.value_fn(sim, t, dst),
            budget=saving,
        )


class Everywhere(RoutingPolicy):
    """Every prefix computed anywhere is on every engine, free: the placement bound."""

    name = "everywhere"

    def setup(self, sim) -> None:
        self.blocks: set[int] = set()

    def _match(self, keys) -> int:
        return leading_match(keys, self.blocks)

    def route(self, sim, i, t, keys):
        return routers.cache_aware(sim, i, t, keys, matcher=self._match)

    def use(self, sim, e, chain, t):
        self.blocks.update(chain)
        return e.cache.use(chain, t)


def alive(sim):
    return [e for e in sim.engines if e.state != GONE]
