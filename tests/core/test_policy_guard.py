"""The harm guard's AIMD (``controlplane.core.policy.harm_guard``): harm cuts an allowance
multiplicatively, rounds without harm grow it back additively, and the allowances cut what the
planner's items may take."""

from __future__ import annotations

import pytest

from controlplane.core.policy import harm_guard
from controlplane.core.policy.strategy import STRATEGY_PREDICTIVE, plan_moves
from controlplane.core.policy.types import (
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
    PlannedMove,
)
from tests.planner_settings import uncharged
from wire.protocol import ENGINE_WARMING

LIMIT = 1.0


def landed(target="b", group="g", before=0.0, after=3.0, copy_s=0.0, lead_s=float("inf")):
    return harm_guard.Landed(
        target=target,
        group=group,
        queue_before_s=before,
        queue_after_s=after,
        copy_s=copy_s,
        lead_s=lead_s,
    )


def test_a_copy_that_raises_its_targets_queue_beyond_the_limit_halves_its_allowance():
    s = harm_guard.observe(
        harm_guard.GuardState(), harm_guard.Signals(landed=[landed()]), limit_s=LIMIT
    )
    assert s.engine("b") == harm_guard.DECREASE and s.group("g") == 1.0  # the engine's harm
    assert "0.00 s to 3.00 s" in s.why["engine:b"] and s.engine("c") == 1.0
    # A second harmful round halves it again; many signals in one round cut once.
    s = harm_guard.observe(
        s, harm_guard.Signals(landed=[landed(), landed(after=5.0)]), limit_s=LIMIT
    )
    assert s.engine("b") == harm_guard.DECREASE**2


@pytest.mark.parametrize(
    "copy",
    [
        landed(after=0.9),  # under the limit
        landed(before=2.9, after=3.0),  # queued as much before: not the copy's doing
        harm_guard.Landed(target="b", group="g", queue_before_s=None, queue_after_s=9.0),  # joining
    ],
)
def test_a_copy_that_did_not_raise_a_queue_beyond_the_limit_is_no_harm(copy):
    s = harm_guard.observe(
        harm_guard.GuardState(), harm_guard.Signals(landed=[copy]), limit_s=LIMIT
    )
    assert s.engine("b") == 1.0 and not s.engines


def test_the_allowance_never_falls_below_the_floor_and_grows_back_additively():
    s = harm_guard.GuardState()
    for _ in range(20):
        s = harm_guard.observe(s, harm_guard.Signals(landed=[landed()]), limit_s=LIMIT)
    assert s.engine("b") == harm_guard.FLOOR
    s = harm_guard.observe(s, harm_guard.Signals(), limit_s=LIMIT)
    assert s.engine("b") == pytest.approx(harm_guard.FLOOR + harm_guard.INCREASE)
    assert "no harm" in s.why["engine:b"]
    for _ in range(int(1 / harm_guard.INCREASE) + 1):
        s = harm_guard.observe(s, harm_guard.Signals(), limit_s=LIMIT)
    assert not s.engines and not s.why  # back at full budget: nothing left to report


def test_evicted_misses_late_copies_and_worse_treated_ttft_are_harm():
    sig = harm_guard.Signals(
        landed=[landed(group="late", after=0.0, copy_s=12.0, lead_s=5.0)],
        evicted_misses={"c": harm_guard.EVICTED_MISSES, "d": harm_guard.EVICTED_MISSES - 1},
        ttft={
            "slow": harm_guard.Compared(treated_s=1.5, held_out_s=1.0, diff_low_s=0.2),
            "fast": harm_guard.Compared(treated_s=0.8, held_out_s=1.0, diff_low_s=-0.4),
            # slower by half, but within noise: not evidence of harm
            "noisy": harm_guard.Compared(treated_s=1.5, held_out_s=1.0, diff_low_s=-0.1),
        },
    )
    s = harm_guard.observe(harm_guard.GuardState(), sig, limit_s=LIMIT)
    assert set(s.engines) == {"c"} and "evicted" in s.why["engine:c"]
    assert set(s.groups) == {"late", "slow"}
    assert (
        "a request it was for came 5.0 s" in s.why["group:late"]
        and "held-out" in s.why["group:slow"]
    )


def test_state_round_trips_through_json_and_bad_json_reads_as_full_budget():
    s = harm_guard.observe(
        harm_guard.GuardState(), harm_guard.Signals(landed=[landed()]), limit_s=LIMIT
    )
    assert harm_guard.GuardState.from_json(s.to_json()) == s
    assert harm_guard.GuardState.from_json(None) == harm_guard.GuardState()
    assert harm_guard.GuardState.from_json({"engines": {"b": "x", "c": -3}}).engines == {
        "c": harm_guard.FLOOR
    }


def _plan(state, planned: bool = False):
    """The (prefix, target) of the items ``plan_moves`` admits under ``state`` (``planned``: of
    the planner's items, before the guard)."""
    budgets = uncharged(horizon_s=300.0, min_confidence=0.0, max_spec_vram_fraction=0.5)
    cands = [Candidate(p, (i,), 16, 1 << 20, "g" + p, 0.5, 3.0) for i, p in enumerate("pq")]
    demand = [Demand(p, 1200.0) for p in "pq"]
    engines = [
        EngineState("a", "n1", 1e10, 1e9, 0.0, 1e10, 0.5),
        EngineState("b", "n2", 1e10, 1e9, 0.0, 1e10, 0.0),
        EngineState("c", "n3", 4e6, 4e6, 0.0, 1e10, 0.0),
        EngineState("w", "n4", 1e10, 1e9, 0.0, 1e10, 0.0, lifecycle=ENGINE_WARMING),
    ]
    holds = [Holding(p, "a") for p in "pq"]
    decision = plan_moves(
        strategy=STRATEGY_PREDICTIVE,
        candidates=cands,
        demand=demand,
        holdings=holds,
        engines=engines,
        budgets=budgets,
        overrides=Overrides(),
        guard=state,
    )
    items = decision.planned if planned else decision.items
    return {(it.prefix_id, it.target) for it in items}


def test_the_limit_is_the_planners_target_queue_limit_else_the_back_offs():
    assert harm_guard.queue_limit_s(uncharged(max_queue_s=2.0, max_cluster_queue_s=1.0)) == 2.0
    assert harm_guard.queue_limit_s(uncharged(max_cluster_queue_s=1.0)) == 1.0
    assert harm_guard.queue_limit_s(uncharged()) == harm_guard.QUEUE_LIMIT_S


def test_the_allowances_cut_the_planners_items_per_engine_and_per_group():
    full = _plan(harm_guard.GuardState())
    assert full == _plan(harm_guard.GuardState(), planned=True)  # full allowance: nothing changes
    assert {t for _, t in full} == {"b", "c", "w"}, full
    # c's slice is 2 MiB (0.5 x 4 MiB): at a quarter it takes no 1 MiB copy.
    assert {t for _, t in _plan(harm_guard.GuardState(engines={"c": 0.25}))} == {"b", "w"}
    # Group gp at half: half of its planned bytes; the warm-up of joining w still goes.
    cut = _plan(harm_guard.GuardState(groups={"gp": 0.5}))
    assert {t for p, t in cut if p == "p"} < {t for p, t in full if p == "p"}
    assert ("p", "w") in cut and {it for it in cut if it[0] == "q"} == {
        it for it in full if it[0] == "q"
    }


def test_the_summary_says_how_much_is_allowed_and_why():
    assert harm_guard.summary(harm_guard.GuardState())["allowed"] == 1.0
    s = harm_guard.observe(
        harm_guard.GuardState(), harm_guard.Signals(landed=[landed()]), limit_s=LIMIT
    )
    out = harm_guard.summary(s, planned=5, admitted=2)
    assert out["allowed"] == harm_guard.DECREASE and out["held_back"] == 3
    assert "engine:b cut to 0.5" in out["why"] and out["engines"] == {"b": 0.5}


def test_a_warm_up_yields_to_requests_queued_on_its_target():
    def move(target):
        return PlannedMove("p", (1,), "a", target, "gpu", 1, 0.0, 1.0, 0.1, 1.0, "r")

    engines = [
        EngineState("b", "n2", 1e10, 1e9, 0.0, 1e10, 0.0, queue_s=0.3),
        EngineState("c", "n3", 1e10, 1e9, 0.0, 1e10, 0.0),
        EngineState("w", "n4", 1e10, 1e9, 0.0, 1e10, 0.0, lifecycle=ENGINE_WARMING),
    ]
    items = [move(t) for t in "bcw"]
    kept, held = harm_guard.spare_only(items, engines=engines, takes_compute=True)
    assert [m.target for m in kept] == ["c", "w"] and set(held) == {"b"}
    assert "queued on its target (0.30 s)" in held["b"]
    # A copy of bytes takes no compute on its target: nothing yields.
    assert harm_guard.spare_only(items, engines=engines, takes_compute=False) == (items, {})


def test_a_queue_that_rose_as_much_on_engines_without_copies_is_no_harm():
    busy = harm_guard.Signals(landed=[harm_guard.Landed(**{**_kw(), "peers_rise_s": 2.9})])
    assert not harm_guard.observe(harm_guard.GuardState(), busy, limit_s=LIMIT).engines
    alone = harm_guard.Signals(landed=[harm_guard.Landed(**{**_kw(), "peers_rise_s": 0.5})])
    assert (
        harm_guard.observe(harm_guard.GuardState(), alone, limit_s=LIMIT).engine("b")
        == harm_guard.DECREASE
    )


def _kw():
    return {"target": "b", "group": "g", "queue_before_s": 0.0, "queue_after_s": 3.0}
