"""One plan's working state (``planner.plan``): its inputs indexed, and what its stages have
used up so far."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from controlplane.core.policy.types import (
    Budgets,
    Candidate,
    Demand,
    EngineState,
    Overrides,
    PlannedMove,
)
from controlplane.core.policy.value import NONE as NO_CALIBRATION
from controlplane.core.policy.value import Calibration


@dataclass
class PlanRound:
    """One plan's working state: the inputs indexed, and what the stages have used up so far."""

    budgets: Budgets
    overrides: Overrides
    engines: Sequence[EngineState]
    candidates: Sequence[Candidate]
    cands: dict[str, Candidate]
    dem: dict[str, Demand]
    by_engine: dict[str, EngineState]
    gpu_holders: dict[str, list[str]]
    lower: dict[str, list[tuple[str, str]]]
    allowed: set[str]
    spare: dict[str, float]
    room: dict[str, float]
    demand_room: dict[str, float]  # room outside the slice, for measured demand's replicas
    bytes_left: float
    backoff: bool
    items: list[PlannedMove] = field(default_factory=list)
    promoted: dict[str, set[str]] = field(default_factory=dict)  # prefix -> engines promoted on
    warmed: dict[str, set[str]] = field(default_factory=dict)  # prefix -> engines warmed
    # The value model's correction from measured outcomes (``core.policy.value``).
    calibration: Calibration = NO_CALIBRATION

    def eligible(self, c: Candidate, d: Demand | None) -> bool:
        if c.prefix_id in self.overrides.pinned:
            return True
        return (
            d is not None
            and d.confidence >= self.budgets.min_confidence
            and d.expected_requests > 0
        )

    def take(self, eid: str, nbytes: float) -> None:
        """An item lands on ``eid``: its bytes leave both rooms there."""
        self.room[eid] = max(0.0, self.room[eid] - nbytes)
        self.demand_room[eid] = max(0.0, self.demand_room[eid] - nbytes)
