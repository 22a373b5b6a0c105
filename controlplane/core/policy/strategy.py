"""The strategy and the planner call: one entry point both adapters use.

- ``predictive``: forecast-driven (the caller's demand is its forecasts and burst risk), with
  the reactive rule as the fallback for prefixes the planner has no signal for.
- ``reactive``: copy a prefix once its measured demand outruns its holders (the caller's demand
  is the measured recent rate; no forecast); ``hot_fanout`` adds Mooncake's hot-key fanout.
- ``off``: nothing is planned.

Budgets and overrides bound every strategy (the planner enforces them), and the harm guard cuts
what the planner's items may take where the last copies did harm; the approval mode is
the caller's (the live control plane stores the items as a plan for its mode).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controlplane.core.policy import harm_guard, planner, spread
from controlplane.core.policy.inputs import EngineReport, engine_states
from controlplane.core.policy.types import (
    Budgets,
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
    PlannedMove,
)
from controlplane.core.policy.value import Calibration

STRATEGY_PREDICTIVE = "predictive"
STRATEGY_REACTIVE = "reactive"
STRATEGY_OFF = "off"
STRATEGIES = (STRATEGY_PREDICTIVE, STRATEGY_REACTIVE, STRATEGY_OFF)


@dataclass(frozen=True)
class Decision:
    """What ``plan_moves`` planned: the planner's items, and those the harm guard admits (what the
    caller executes or stores)."""

    planned: list[PlannedMove]
    items: list[PlannedMove]


def plan_moves(
    *,
    strategy: str,
    candidates: Sequence[Candidate],
    demand: Iterable[Demand],
    holdings: Iterable[Holding],
    engines: Sequence[EngineReport] | Sequence[EngineState],
    budgets: Budgets,
    overrides: Overrides,
    guard: harm_guard.GuardState,
    narrowed: list[spread.Narrowed] | None = None,
    calibration: Calibration | None = None,
) -> Decision:
    """Items for ``strategy`` within ``budgets`` and ``overrides``, cut by the harm guard's
    allowances (``guard``, ``core.policy.harm_guard``: where the last copies did harm; a fresh
    ``GuardState()`` cuts nothing). ``engines`` are reports (turned into engine states by the
    shared input rules) or states made by them already. The live plan cycle and the simulator
    both call it so: the guard applies in one place. ``narrowed``: where a list is given,
    ``predictive``'s plan leaves no prefix on fewer holders than its measured demand alone
    would (``core.policy.spread``, the guard's concentration signal), and the prefixes it
    would have narrowed are appended to it. ``calibration``: the value model's correction from
    measured outcomes (``core.policy.value``)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    if strategy == STRATEGY_OFF:
        return Decision([], [])
    states = states_of(engines, horizon_s=budgets.horizon_s)
    candidates = list(candidates)
    demand, holdings = list(demand), list(holdings)
    planned = planner.plan(candidates, demand, holdings, states, budgets, overrides, calibration)
    if narrowed is not None and strategy == STRATEGY_PREDICTIVE:
        planned, seen = spread.spread(
            planned,
            candidates=candidates,
            demand=demand,
            holdings=holdings,
            engines=states,
            budgets=budgets,
            overrides=overrides,
            calibration=calibration,
        )
        narrowed.extend(seen)
    items = harm_guard.admit(
        planned, state=guard, engines=states, candidates=candidates, budgets=budgets
    )
    return Decision(planned, items)


def states_of(
    engines: Sequence[EngineReport] | Sequence[EngineState], *, horizon_s: float
) -> list[EngineState]:
    reports = [e for e in engines if isinstance(e, EngineReport)]
    if not reports:
        return list(engines)  # type: ignore[arg-type]
    if len(reports) != len(engines):
        raise TypeError("engines must be all reports or all states")
    return engine_states(reports, horizon_s=horizon_s)
