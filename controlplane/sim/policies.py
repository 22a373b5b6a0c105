"""The eight policies a run compares: four routers, and four replication policies on top of
``cache-aware`` routing (``reactive``, ``predictive``, ``oracle``, ``everywhere``)."""

from __future__ import annotations

from controlplane.core.policies.reactive import ReactiveRule
from controlplane.core.prefix_cache import leading_match
from controlplane.sim import routers
from controlplane.sim.engine import GONE

POLICIES = (
    "random",
    "round-robin",
    "least-loaded",
    "cache-aware",
    "reactive",
    "predictive",
    "oracle",
    "everywhere",
)


class Policy:
    """Routing plus, optionally, replication. Subclasses override the hooks they need."""

    name = "cache-aware"
    tick_s = 0.0
    before_route = None  # (sim, i, t, pid, keys) -> None

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


class Reactive(Policy):
    """Cache-aware routing plus the guarded hot-spot copy (``ReactiveRule``)."""

    name = "reactive"

    def __init__(self, rule: ReactiveRule | None = None) -> None:
        super().__init__()
        self.rule = rule or ReactiveRule()
        self.before_route = self._maybe_copy

    def _maybe_copy(self, sim, i, t, pid, keys) -> None:
        rule = self.rule
        if len(keys) < rule.min_blocks:
            return
        holder, best_m, hwait = None, 0, 0.0
        for e in sim.serving:
            m = e.cache.match(keys)
            if m > best_m or (m == best_m and m and e.free_at < holder.free_at):
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
        if rule.should_copy(hwait, land - t, in_flight):
            sim.start_copy(pid, chain, holder, target, t, speculative=False)


class Everywhere(Policy):
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


def make_policy(name: str, **options) -> Policy:
    if name == "random":
        p = Policy(routers.random_router)
    elif name == "round-robin":
        p = Policy(routers.RoundRobin())
    elif name == "least-loaded":
        p = Policy(routers.least_loaded)
    elif name == "cache-aware":
        p = Policy()
    elif name == "reactive":
        return Reactive(options.get("reactive_rule", ReactiveRule()))
    elif name == "everywhere":
        return Everywhere()
    elif name in ("predictive", "oracle"):
        from controlplane.sim.planned import PlannedPolicy

        return PlannedPolicy(name, **options)
    else:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    p.name = name
    return p


def alive(sim):
    return [e for e in sim.engines if e.state != GONE]
