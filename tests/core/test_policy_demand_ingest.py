"""The one demand rule (``core.policy.demand``) and the ingest re-plan's storm bound
(``core.policy.ingest``), in the units both adapters feed them."""

from __future__ import annotations

import pytest

from controlplane.core.policy.demand import combined, forecast_rate
from controlplane.core.policy.harm_guard import GuardState
from controlplane.core.policy.ingest import (
    HYSTERESIS,
    MAX_LINK_QUEUE_S,
    MIN_INTERVAL_S,
    IngestBound,
    wants_replan,
)
from controlplane.core.policy.inputs import EngineReport, engine_states
from controlplane.core.policy.strategy import plan_moves
from controlplane.core.policy.types import Candidate, Demand, Holding, Overrides
from tests.planner_settings import uncharged

H = 120.0


@pytest.mark.parametrize("forecast_rate_per_s", [0.0, 0.5, 2.0])
def test_a_forecast_below_measured_demand_never_drops_it(forecast_rate_per_s):
    forecast = Demand("p", forecast_rate_per_s * H, 0.0, forecast_rate_per_s, 0.9)
    d = combined("p", measured_rate=3.0, horizon_s=H, forecast=forecast, min_confidence=0.0)
    assert d.expected_requests >= 3.0 * H and d.confidence == 1.0
    assert d.measured_rate == 3.0 and d.forecast_rate == forecast_rate_per_s


def test_a_forecast_adds_what_it_sees_beyond_measured_demand_with_its_confidence():
    forecast = Demand("p", 5.0 * H, 0.5, 20.0, 0.5)  # a burst to 20/s with p = 0.5
    f = forecast_rate(forecast, H)
    assert f == pytest.approx(12.5)
    d = combined("p", measured_rate=1.0, horizon_s=H, forecast=forecast, min_confidence=0.0)
    assert d.expected_requests / H == pytest.approx(1.0 + 0.5 * (12.5 - 1.0))
    # Below the policy's confidence floor, the forecast adds nothing; the measured rate stays.
    low = combined("p", measured_rate=1.0, horizon_s=H, forecast=forecast, min_confidence=0.6)
    assert low.expected_requests == pytest.approx(1.0 * H)
    # A burst's onset is the rate now.
    onset = combined("p", measured_rate=1.0, horizon_s=H, onset_rate=6.0, min_confidence=0.0)
    assert onset.measured_rate == 6.0 and onset.expected_requests == pytest.approx(6.0 * H)


def test_predictive_plans_at_least_what_reactive_plans_on_measured_demand():
    """The same snapshot: predictive's demand with a forecast of nothing copies what reactive's
    copies (a forecast saying less drops nothing)."""
    cands = [Candidate("p", (1, 2), 32, 10, "t", 0.5, 3.0)]
    engines = [
        EngineReport(
            engine_id=e,
            node=e,
            kv_capacity_bytes=100.0,
            free_bytes=100.0,
            link_bytes_per_s=10.0,
            running=r,
        )
        for e, r in (("a", 0.9), ("b", 0.1), ("c", 0.1))
    ]
    args = dict(
        candidates=cands,
        holdings=[Holding("p", "a")],
        engines=engines,
        budgets=uncharged(horizon_s=H, min_confidence=0.0),
        overrides=Overrides(),
        guard=GuardState(),
    )
    reactive = plan_moves(
        strategy="reactive",
        demand=[combined("p", measured_rate=4.0, horizon_s=H, min_confidence=0.0)],
        **args,
    ).items
    zero = Demand("p", 0.0, 0.0, 0.0, 0.9)
    predictive = plan_moves(
        strategy="predictive",
        demand=[combined("p", measured_rate=4.0, horizon_s=H, forecast=zero, min_confidence=0.0)],
        **args,
    ).items
    assert reactive and [(m.prefix_id, m.target) for m in reactive] == [
        (m.prefix_id, m.target) for m in predictive
    ]


def test_the_ingest_rule_replans_a_prefix_only_above_its_holders():
    kw = dict(blocks=4, min_blocks=2, holders=1, load=0.5, service_s=0.5)
    assert wants_replan(arrivals=20, rate=4.0, **kw)  # 4/s > 1 x 0.5 / 0.5
    assert not wants_replan(arrivals=5, rate=4.0, **kw)  # too few arrivals in the minute
    assert not wants_replan(arrivals=20, rate=4.0, **{**kw, "holders": 5})


def _states(link_queue_s=0.0):
    reports = [
        EngineReport(
            engine_id=f"e{i}",
            node=f"n{i}",
            kv_capacity_bytes=1e12,
            free_bytes=1e12,
            link_bytes_per_s=1e9,
            link_bytes_queued=link_queue_s * 1e9 if i else 0.0,
            running=0.95 if i == 0 else 0.1,
        )
        for i in range(16)
    ]
    return engine_states(reports, horizon_s=H)


def burst(bound: IngestBound, *, seconds=60, copy_s=5.0, rate=lambda t: 40.0) -> list:
    """A burst that keeps arriving: every second an ingest offers the prefix, whose demand
    outruns any number of holders the plan gives it; each copy lands ``copy_s`` later. Returns
    the ingest copies (time, target)."""
    cand = Candidate("p", (1, 2), 32, int(copy_s * 1e9), "t", 0.5, 3.0)
    holders, landing, copies = {"e0"}, [], []
    for t in range(seconds):
        holders |= {eid for when, eid in landing if when <= t}
        landing = [(w, e) for w, e in landing if w > t]
        r = rate(t)
        if not bound.due("p", now=float(t), rate=r, in_flight=bool(landing)):
            continue
        items = plan_moves(
            strategy="reactive",
            candidates=[cand],
            demand=[combined("p", measured_rate=r, horizon_s=H, min_confidence=0.0)],
            holdings=[Holding("p", h) for h in sorted(holders)],
            engines=_states(),
            budgets=uncharged(horizon_s=H, min_confidence=0.0, max_spec_vram_fraction=0.5),
            overrides=Overrides(),
            guard=GuardState(),
        ).items
        # Live and simulated: a target already receiving the prefix is not sent it twice.
        items = [i for i in items if i.target not in {e for _, e in landing}][:1]
        for it in bound.admit(items, engines=_states(), now=float(t), rates={"p": r}):
            landing.append((t + copy_s, it.target))
            copies.append((t, it.target))
    return copies


def test_the_ingest_replan_cannot_copy_a_prefix_again_and_again():
    unbounded = burst(IngestBound(enabled=False))
    bound = IngestBound()
    bounded = burst(bound)
    # Without the bound the burst copies its prefix every re-plan interval (2 s), while the
    # last copy is still on its way, until every engine of the fleet holds it.
    assert len(unbounded) == 15 and unbounded[-1][0] <= 30
    # With it: never while a copy is on its way, and at most once per MIN_INTERVAL_S at a
    # steady rate.
    times = [t for t, _ in bounded]
    assert times and all(b - a >= MIN_INTERVAL_S for a, b in zip(times, times[1:], strict=False))
    assert len(bounded) <= 60 / MIN_INTERVAL_S + 1
    assert bound.held_back_replans > 0 and bound.stats()["copies"] == len(bounded)


def test_a_burst_still_building_passes_the_bound_by_its_hysteresis():
    # The rate doubles every 6 s: past HYSTERESIS x the rate of the last copy, it copies again
    # sooner than MIN_INTERVAL_S (once the last copy landed).
    grow = burst(IngestBound(), seconds=30, copy_s=1.0, rate=lambda t: 5.0 * 2 ** (t / 6))
    times = [t for t, _ in grow]
    assert any(b - a < MIN_INTERVAL_S for a, b in zip(times, times[1:], strict=False))
    assert HYSTERESIS > 1.0


def test_a_target_whose_link_is_busy_takes_no_ingest_copy():
    bound = IngestBound()
    cand = Candidate("p", (1, 2), 32, int(1e9), "t", 0.5, 3.0)
    args = dict(
        strategy="reactive",
        candidates=[cand],
        demand=[combined("p", measured_rate=40.0, horizon_s=H, min_confidence=0.0)],
        holdings=[Holding("p", "e0")],
        budgets=uncharged(horizon_s=H, min_confidence=0.0),
        overrides=Overrides(),
        guard=GuardState(),
    )
    busy = _states(link_queue_s=MAX_LINK_QUEUE_S + 1)
    items = plan_moves(engines=busy, **args).items
    assert items and not bound.admit(items, engines=busy, now=0.0, rates={"p": 40.0})
    assert bound.held_back_items == len(items)
