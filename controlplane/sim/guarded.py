"""The simulator's feed to the harm guard (``controlplane.core.policy.guard``): the signals the
live control plane reads from its agents and records, taken from the simulated cluster.

Each speculative copy ``predictive`` starts is watched: its target's queue when it was planned
(the shared input rule's ``queue_s``; none for a joining engine), when it lands, how long it took
and the forecast's lead (the first expected request, where the demand names one). At each round
the copies landed since the last one are compared with their targets' queue now, and the guard's
state steps (``guard.observe``); the planner's items are then cut to its allowances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from controlplane.core.policy import guard
from controlplane.core.policy.types import Budgets, EngineState
from controlplane.core.protocol import ENGINE_SERVING


@dataclass
class Watched:
    lands_at: float
    target: str
    group: str
    queue_before_s: float | None
    copy_s: float
    lead_s: float
    queues_at_plan: dict[str, float]  # every serving engine's queue at planning (shared)


@dataclass
class SimGuard:
    state: guard.GuardState = field(default_factory=guard.GuardState)
    watched: list[Watched] = field(default_factory=list)
    rounds: int = 0
    harmful_rounds: int = 0
    min_allowed: float = 1.0

    def record(
        self,
        *,
        target: EngineState | None,
        group: str,
        queues_at_plan: dict[str, float],
        planned_at: float,
        lands_at: float | None,
        lead_s: float,
    ) -> None:
        if lands_at is None or target is None:
            return
        before = target.queue_s if target.lifecycle == ENGINE_SERVING else None
        self.watched.append(
            Watched(
                lands_at,
                target.engine_id,
                group,
                before,
                lands_at - planned_at,
                lead_s,
                queues_at_plan,
            )
        )

    def stats(self) -> dict:
        """For the run's summary: rounds stepped, rounds that cut an allowance, the lowest
        allowance reached."""
        return {
            "rounds": self.rounds,
            "harmful_rounds": self.harmful_rounds,
            "min_allowed": round(self.min_allowed, 4),
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
                    guard.Landed(
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
        before = self.state
        self.state = guard.observe(
            before, guard.Signals(landed=landed), limit_s=guard.queue_limit_s(budgets)
        )
        self.rounds += 1
        cut = any(self.state.engine(k) < before.engine(k) for k in self.state.engines) or any(
            self.state.group(k) < before.group(k) for k in self.state.groups
        )
        self.harmful_rounds += cut
        self.min_allowed = min(self.min_allowed, guard.summary(self.state)["allowed"])


def serving_queues(engines: list[EngineState]) -> dict[str, float]:
    return {e.engine_id: e.queue_s for e in engines if e.lifecycle == ENGINE_SERVING}


def peers_rise(then: dict[str, float], now: dict[str, float], target: str) -> float:
    """The mean queue rise from ``then`` to ``now`` of the serving engines but ``target``."""
    rises = [now[k] - q for k, q in then.items() if k != target and k in now]
    return sum(rises) / len(rises) if rises else 0.0


def lead_of(first_arrival_s: float) -> float:
    """The forecast's lead for a copy: seconds to the first expected request, where the demand
    names one (``first_arrival_s`` > 0), else unknown (infinite)."""
    return first_arrival_s if first_arrival_s > 0 else math.inf
