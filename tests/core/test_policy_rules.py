"""The shared policy's rules, in the units both adapters feed them."""

from __future__ import annotations

import pytest

from controlplane.core.policy import onset
from controlplane.core.policy.harm_guard import GuardState
from controlplane.core.policy.ingest import IngestBound, wants_replan
from controlplane.core.policy.inputs import EngineReport, engine_states, spec_room
from controlplane.core.policy.strategy import Decision, plan_moves
from controlplane.core.policy.types import Candidate, Demand, Holding, Overrides
from tests.planner_settings import uncharged


def report(eid, lifecycle="serving", **kw):
    base = {"node": "n", "kv_capacity_bytes": 100.0, "free_bytes": 50.0, "link_bytes_per_s": 10.0}
    return EngineReport(engine_id=eid, lifecycle=lifecycle, **{**base, **kw})


def test_load_is_running_over_slots_plus_the_queue_over_the_horizon():
    a, b, w = engine_states(
        [
            report("a", running=1, slots=4, waiting=10, request_s=3.0),  # 30 s queued
            report("b", running=0, slots=1),
            report("w", lifecycle="warming"),
        ],
        horizon_s=60.0,
    )
    assert a.queue_s == 30.0 and a.load == pytest.approx(0.25 + 0.5)
    assert b.load == 0.0 and b.queue_s == 0.0
    # A joining engine takes its share of the serving engines' mean load: 0.375 x 2 / 3.
    assert w.load == pytest.approx(0.25) and w.queue_s == 0.0


def test_room_takes_cold_blocks_cheapest_first_and_charges_their_value():
    # 10 free bytes; cached: 20 bytes worth 0.1 s, 20 worth 0.3 s, 20 worth 5 s.
    room, held = spec_room(
        free_bytes=10.0, cached=[(20.0, 5.0), (20.0, 0.3), (20.0, 0.1)], cold_value_s=0.5
    )
    assert (room, held) == (50.0, pytest.approx(0.4))
    (state,) = engine_states([report("a", free_bytes=room, displaced_s=held)], horizon_s=60.0)
    assert state.displaced_s_per_byte == pytest.approx(0.4 / 50.0)


def test_a_burst_onset_is_the_rate_now_above_twice_the_long_rate():
    rate = onset.onset_rate(short_rate=4.0, long_rate=1.0)  # 20 arrivals in 5 s, 4x the minute
    assert rate == 4.0
    assert onset.onset_rate(short_rate=4.0, long_rate=2.5) == 0.0  # not twice the long rate
    assert onset.onset_rate(short_rate=1.0, long_rate=0.1) == 0.0  # 5 arrivals: too few
    # Re-planned at once where it outruns its holders, not twice within ONSET_REPLAN_S.
    kw = dict(blocks=4, min_blocks=2, holders=1, load=0.5, service_s=0.5)
    assert wants_replan(arrivals=20, rate=rate, **kw)  # 4/s > 1 x 0.5 / 0.5
    bound = IngestBound()
    assert bound.due("p", now=10.0, rate=rate, in_flight=False)
    assert not bound.due("p", now=10.0 + onset.ONSET_REPLAN_S / 2, rate=rate, in_flight=False)


def test_strategy_off_plans_nothing_and_an_unknown_one_is_refused():
    args = dict(
        candidates=[Candidate("p", (1, 2), 32, 10, "t", 0.5, 3.0)],
        demand=[Demand("p", 1200.0)],
        holdings=[Holding("p", "a")],
        engines=[report("a", running=1), report("b", free_bytes=100.0)],
        budgets=uncharged(horizon_s=300.0, min_confidence=0.0),
        overrides=Overrides(),
        guard=GuardState(),
    )
    assert [m.target for m in plan_moves(strategy="reactive", **args).items] == ["b"]
    assert plan_moves(strategy="off", **args) == Decision([], [])
    with pytest.raises(ValueError):
        plan_moves(strategy="sometimes", **args)
