"""The simulator's feed to the harm guard (``controlplane.core.policy.harm_guard``): the signals the
live control plane reads from its agents and records, taken from the simulated cluster.

Each speculative copy ``predictive`` starts is watched: its target's queue when it was planned
(the shared input rule's ``queue_s``; none for a joining engine), when it lands and so how long it
took from planning. Requests served with nothing of their prefix cached are classified by the
miss reasons the control plane decides at ingest (``core.misses``: ``warming`` when a copy of the
prefix to the serving engine is in flight, ``evicted`` when the engine removed the prefix's first
block within the residency index's removal window, ``REMOVAL_WINDOW_S``). A ``warming`` miss on a
watched copy's target is the first request it was for arriving before it landed: its lead (seconds
from planning). ``evicted`` misses are counted per engine. At each round the copies landed since
the last one are compared with their targets' queue now, the ``evicted`` misses since the last
round on their targets are added, and the guard's state steps (``guard.observe``); the planner's
items are then cut to its allowances.

The simulator has no randomized holdout, so the guard's treated-vs-held-out TTFT signal is fed
by the live control plane alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from controlplane.core import misses
from controlplane.core.policy import harm_guard, spread
from controlplane.core.policy.inputs import estimate_queue_s
from controlplane.core.policy.types import Budgets, EngineState
from controlplane.core.residency_index import REMOVAL_WINDOW_S
from controlplane.sim.adapter import waiting_requests
from wire.protocol import ENGINE_SERVING


@dataclass
class Watched:
    lands_at: float
    target: str
    group: str
    queue_before_s: float | None
    copy_s: float
    queues_at_plan: dict[str, float]  # every serving engine's queue at planning (shared)
    prefix: int
    planned_at: float
    lead_s: float = math.inf  # planning to the first ``warming`` miss on its target


@dataclass
class SimGuard:
    state: harm_guard.GuardState = field(default_factory=harm_guard.GuardState)
    watched: list[Watched] = field(default_factory=list)
    rounds: int = 0
    harmful_rounds: int = 0
    min_allowed: float = 1.0
    evicted: dict[str, int] = field(default_factory=dict)  # misses since the last round
    late: int = 0  # copies a request they were for arrived before (a lead shorter than them)
    evicted_seen: int = 0  # ``evicted`` misses fed to the guard (on targets of landed copies)
    copies: int = 0  # copies it watched (planner, onset and fallback alike)
    # plans that would have left a prefix on fewer holders than measured demand alone
    # (``core.policy.spread``): the prefixes, the copies given back, the items held back
    narrowed: int = 0
    restored: int = 0
    held_back: int = 0

    def spread(self, narrowed: list[spread.Narrowed]) -> None:
        """A plan's prefixes the concentration signal saw narrowed, and what it did."""
        self.narrowed += len(narrowed)
        self.restored += sum(len(n.restored) for n in narrowed)
        self.held_back += sum(len(n.held_back) for n in narrowed)

    def record(
        self,
        *,
        target: str,
        queue_before_s: float | None,
        group: str,
        prefix: int,
        queues_at_plan: dict[str, float],
        planned_at: float,
        lands_at: float | None,
    ) -> None:
        """A copy to ``target`` started (a planner, onset or fallback copy alike), whose queue
        was ``queue_before_s`` then (None: it was not serving yet)."""
        if lands_at is None:
            return
        self.copies += 1
        self.watched.append(
            Watched(
                lands_at,
                target,
                group,
                queue_before_s,
                lands_at - planned_at,
                queues_at_plan,
                prefix,
                planned_at,
            )
        )

    def miss(
        self,
        *,
        engine: str,
        prefix: int,
        blocks: int,
        t: float,
        warming: bool,
        removed_at: float | None,
    ) -> str:
        """A request of ``prefix`` (``blocks`` long) served on ``engine`` at ``t`` with nothing
        of it cached: its reason (``core.misses``), counted where the guard watches it.
        ``warming``: a copy of the prefix to the engine was in flight; ``removed_at``: when the
        engine last removed the prefix's first block."""
        facts = misses.Facts(
            prefix_blocks=max(1, blocks),
            cached_blocks=0,
            warming=warming,
            evicted=misses.removed_in_window(removed_at, t, REMOVAL_WINDOW_S, 0.0),
        )
        reason = misses.classify(facts)
        if reason == misses.EVICTED:
            self.evicted[engine] = self.evicted.get(engine, 0) + 1
        elif reason == misses.WARMING:
            for w in self.watched:
                if (
                    w.prefix == prefix
                    and w.target == engine
                    and w.planned_at <= t
                    and math.isinf(w.lead_s)
                ):
                    w.lead_s = t - w.planned_at
        return reason

    def stats(self) -> dict:
        """For the run's summary: rounds stepped, rounds that cut an allowance, the lowest
        allowance reached, and the signals' counts (copies a request they were for arrived
        before, ``evicted`` misses on engines while they took copies, prefixes a plan would
        have narrowed and what was given back and held back for them)."""
        return {
            "rounds": self.rounds,
            "harmful_rounds": self.harmful_rounds,
            "min_allowed": round(self.min_allowed, 4),
            "late_copies": self.late,
            "evicted_misses": self.evicted_seen,
            "copies_watched": self.copies,
            "narrowed": self.narrowed,
            "spread_restored": self.restored,
            "spread_held_back": self.held_back,
        }

    def observe(self, t: float, engines: list[EngineState], budgets: Budgets) -> None:
        """The copies landed by ``t`` against their targets' queue now: the guard steps."""
        queue = {e.engine_id: e.queue_s for e in engines}
        serving = serving_queues(engines)
        landed, left = [], []
        for w in self.watched:
            if w.lands_at > t:
                left.append(w)
            elif w.target in queue:
                landed.append(
                    harm_guard.Landed(
                        target=w.target,
                        group=w.group,
                        queue_before_s=w.queue_before_s,
                        queue_after_s=queue[w.target],
                        copy_s=w.copy_s,
                        lead_s=w.lead_s,
                        peers_rise_s=peers_rise(w.queues_at_plan, serving, w.target),
                    )
                )
        self.watched = left
        self.late += sum(c.copy_s > c.lead_s for c in landed)
        targets = {c.target for c in landed}
        evicted = {k: n for k, n in self.evicted.items() if k in targets}
        self.evicted = {}
        self.evicted_seen += sum(evicted.values())
        before = self.state
        self.state = harm_guard.observe(
            before,
            harm_guard.Signals(landed=landed, evicted_misses=evicted),
            limit_s=harm_guard.queue_limit_s(budgets),
        )
        self.rounds += 1
        cut = any(self.state.engine(k) < before.engine(k) for k in self.state.engines) or any(
            self.state.group(k) < before.group(k) for k in self.state.groups
        )
        self.harmful_rounds += cut
        self.min_allowed = min(self.min_allowed, harm_guard.summary(self.state)["allowed"])


def queue_of(e, t: float) -> float:
    """A simulated engine's queue in seconds by the shared input rule (waiting x request)."""
    waiting, request_s = waiting_requests(e, t)
    return estimate_queue_s(waiting=waiting, request_s=request_s)


def serving_queues(engines: list[EngineState]) -> dict[str, float]:
    return {e.engine_id: e.queue_s for e in engines if e.lifecycle == ENGINE_SERVING}


def peers_rise(then: dict[str, float], now: dict[str, float], target: str) -> float:
    """The mean queue rise from ``then`` to ``now`` of the serving engines but ``target``."""
    rises = [now[k] - q for k, q in then.items() if k != target and k in now]
    return sum(rises) / len(rises) if rises else 0.0
