"""The harm guard's concentration signal (``controlplane.core.policy.spread``): a forecast copy
that takes the room measured demand's copy of a bursting prefix would have had leaves that prefix
on fewer holders than ``reactive`` would; the signal sees it, holds the forecast copy back and
gives reactive's copy back."""

from __future__ import annotations

import dataclasses

from controlplane.core.policy import spread
from controlplane.core.policy.demand import combined
from controlplane.core.policy.harm_guard import GuardState
from controlplane.core.policy.strategy import STRATEGY_PREDICTIVE, STRATEGY_REACTIVE, plan_moves
from controlplane.core.policy.types import (
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
)
from tests.planner_settings import uncharged
from wire.protocol import ENGINE_WARMING

H = 300.0
BUDGETS = uncharged(horizon_s=H, min_confidence=0.0, max_warming_fraction=0.5)


def _case(fore_rate: float = 0.1):
    """One serving engine holding both prefixes, one joining engine with warm-up room (half of
    100 bytes) for one of them. ``hot``: measured 1 request/s now; ``fore``: none measured,
    forecast ``fore_rate``, and a longer prefill, so the planner prefers warming it."""
    cands = [
        Candidate("hot", (1,), 16, 40, "g-hot", 0.1, 1.0),
        Candidate("fore", (2,), 16, 40, "g-fore", 0.1, 1.5),
    ]
    demand = [
        combined("hot", measured_rate=1.0, horizon_s=H, min_confidence=0.0),
        combined(
            "fore",
            measured_rate=0.0,
            horizon_s=H,
            forecast=Demand("fore", fore_rate * H),
            min_confidence=0.0,
        ),
    ]
    engines = [
        EngineState("s", "n1", 100.0, 100.0, 0.0, 1e10, 0.5),
        EngineState("j", "n2", 100.0, 100.0, 0.0, 1e10, 0.0, ENGINE_WARMING, 10.0),
    ]
    holds = [Holding(p, "s") for p in ("hot", "fore")]
    return cands, demand, engines, holds


def _items(strategy=STRATEGY_PREDICTIVE, narrowed=None, fore_rate=0.1):
    cands, demand, engines, holds = _case(fore_rate)
    if strategy == STRATEGY_REACTIVE:  # the shipped reactive plans the measured part alone
        demand = spread.measured_part(demand, H)
    return plan_moves(
        strategy=strategy,
        candidates=cands,
        demand=demand,
        holdings=holds,
        engines=engines,
        budgets=BUDGETS,
        overrides=Overrides(),
        guard=GuardState(),
        narrowed=narrowed,
    ).items


def _decide(strategy=STRATEGY_PREDICTIVE, narrowed=None, fore_rate=0.1):
    return [(it.prefix_id, it.target) for it in _items(strategy, narrowed, fore_rate)]


def test_a_forecast_copy_that_narrows_a_measured_prefix_is_held_back_for_reactives():
    # Without the signal the forecast's warm-up takes the joiner's room: the measured prefix
    # would meet its burst on its one holder, where reactive would have warmed the joiner.
    assert _decide(STRATEGY_REACTIVE) == [("hot", "j")]
    assert _decide() == [("fore", "j")]
    seen: list[spread.Narrowed] = []
    assert _decide(narrowed=seen) == [("hot", "j")]
    assert seen == [spread.Narrowed("hot", 1, 2, ("j",), ("fore->j",))]
    out = spread.summary(seen)
    assert out["narrowed"] == 1 and out["restored"] == 1 and out["held_back"] == 1
    assert "left it on 1 holder(s), measured demand alone on 2" in out["why"]
    assert "copies to j given back, fore->j held back" in out["why"]


def test_a_plan_that_spreads_measured_demand_as_reactive_does_is_unchanged():
    # No forecast beyond the measured part: predictive's plan is reactive's, nothing narrowed.
    seen: list[spread.Narrowed] = []
    assert _decide(narrowed=seen, fore_rate=0.0) == [("hot", "j")] and seen == []
    # ``reactive`` itself is never checked against itself.
    assert _decide(STRATEGY_REACTIVE, narrowed=seen) == [("hot", "j")] and seen == []


def test_no_copy_is_given_back_without_room_freed_for_it():
    cands, demand, engines, holds = _case()
    # The forecast's item is on another target: holding it back frees nothing on the joiner.
    moved = [dataclasses.replace(it, target="x") for it in _items()]
    kept, seen = spread.spread(
        moved,
        candidates=cands,
        demand=demand,
        holdings=holds,
        engines=engines,
        budgets=BUDGETS,
        overrides=Overrides(),
    )
    assert kept == moved
    assert seen == [spread.Narrowed("hot", 1, 2)]
    assert "no forecast copy to hold back" in seen[0].why()
