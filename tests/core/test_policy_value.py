"""The value model answers to outcomes: its terms, their measured ratios, and the correction the
planner applies (``controlplane.core.policy.value``)."""

import math

import pytest

from controlplane.core.policy import value
from controlplane.core.policy.harm_guard import GuardState
from controlplane.core.policy.planner import plan
from controlplane.core.policy.strategy import STRATEGY_PREDICTIVE, plan_moves
from controlplane.core.policy.types import (
    Budgets,
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
)
from controlplane.core.policy.value import (
    MIN_FACTOR,
    REPLICA,
    REQUESTS,
    SAVING,
    VALUE,
    WARM_UP,
    Calibration,
    Ledger,
    Outcome,
    ValueTerms,
)
from tests.planner_settings import uncharged
from wire.protocol import ENGINE_WARMING, TIER_CPU

GB = 1e9

# The committed demo scoreboard's item: modelled 1,901.7 s, creditable at most one prefill, 9.7 s.
INFLATED = ValueTerms(REPLICA, requests=196.0, saving_s=9.7025, discount=1.0)
ONE_PREFILL_S = 9.7


def used(n: int, hits: int = 150) -> list[Outcome]:
    return [Outcome(INFLATED, hits, ONE_PREFILL_S) for _ in range(n)]


def test_inflated_values_give_a_ratio_far_below_one_and_the_correction_falls_toward_measured():
    stats = value.tally(used(100))
    assert stats[(REPLICA, REQUESTS)].ratio == pytest.approx(150 / 196)
    assert stats[(REPLICA, SAVING)].ratio == pytest.approx(ONE_PREFILL_S / (150 * 9.7025))
    assert stats[(REPLICA, VALUE)].ratio < 0.01
    modelled = INFLATED.value
    assert modelled == pytest.approx(1901.7, abs=0.1)
    corrected = []
    for n in (0, 1, 10, 100, 400):
        ledger = Ledger()
        for o in used(n):
            ledger.add(o)
        corrected.append(ledger.calibration().value(INFLATED))
    assert corrected[0] == pytest.approx(modelled)  # no evidence: the model as is
    assert corrected[1] > 0.9 * modelled  # one copy moves it little (shrunk towards 1)
    # ... and each step of evidence brings it closer to what was measured, never below the bound
    assert all(a > b for a, b in zip(corrected, corrected[1:], strict=False))
    assert corrected[-1] < 0.05 * modelled
    assert corrected[-1] >= modelled * MIN_FACTOR**2 - 1e-9
    assert abs(corrected[-1] - ONE_PREFILL_S) < abs(modelled - ONE_PREFILL_S) / 20


def test_unused_copies_cut_the_requests_term_only():
    stats = value.tally([Outcome(INFLATED, 0, 0.0)] * 30 + used(10, hits=196))
    assert stats[(REPLICA, REQUESTS)].n == 40
    assert stats[(REPLICA, REQUESTS)].ratio == pytest.approx(0.25)
    assert stats[(REPLICA, SAVING)].n == 10  # per-request saving is measured on used copies
    cal = value.calibrate(stats)
    assert cal.factor(REPLICA, REQUESTS) < 1.0
    assert cal.factor(WARM_UP, REQUESTS) == 1.0  # no evidence on warm-ups: untouched


def test_factors_are_bounded_and_rows_say_ratio_and_factor():
    ledger = Ledger(prior_weight=0.0)
    for _ in range(50):
        ledger.add(Outcome(ValueTerms(REPLICA, 1.0, 1.0), 10.0, 100.0))  # an underestimate
    cal = ledger.calibration()
    assert cal.factor(REPLICA, REQUESTS) == value.MAX_FACTOR
    rows = value.rows(ledger.stats(), cal)
    by = {(r["kind"], r["term"]): r for r in rows}
    assert by[(REPLICA, REQUESTS)]["ratio"] == 10.0 and by[(REPLICA, REQUESTS)]["copies"] == 50
    assert by[(REPLICA, VALUE)]["factor"] == value.MAX_FACTOR**2


def test_stored_terms_round_trip_and_bad_rows_are_none():
    assert ValueTerms.from_dict(INFLATED.as_dict()) == INFLATED
    assert ValueTerms.from_dict({}) is None
    assert ValueTerms.from_dict({**INFLATED.as_dict(), "kind": "nonsense"}) is None
    assert ValueTerms.from_dict({**INFLATED.as_dict(), "requests": math.nan}) is None


# -- the planner applies it ----------------------------------------------------------------


def engines(n=4, load=0.2, link=12.5e9):
    return [EngineState(f"e{i}", f"n{i}", 100 * GB, 100 * GB, 0.0, link, load) for i in range(n)]


def hot(pid="p"):
    c = Candidate(pid, (1, 2, 3), 16384, int(5 * GB), "t", service_s=0.2, recompute_s=3.0)
    return c, Demand(pid, 600.0, 0.5, 8.0, 0.9)


def test_the_planner_values_items_by_their_terms_times_the_correction():
    c, d = hot()
    b = Budgets(horizon_s=60)
    raw = plan([c], [d], [Holding("p", "e0")], engines(), b)
    assert raw
    for it in raw:
        assert it.terms is not None and it.terms.kind == REPLICA
        assert it.expected_ttft_saved_s == pytest.approx(it.terms.value)
    half = Calibration({(REPLICA, SAVING): 0.5})
    cut = plan([c], [d], [Holding("p", "e0")], engines(), b, calibration=half)
    assert cut[0].terms == raw[0].terms  # the terms stay the model's
    assert cut[0].expected_ttft_saved_s == pytest.approx(0.5 * raw[0].expected_ttft_saved_s)


def test_an_inflated_model_corrected_buys_no_copy_its_outcomes_do_not_pay_for():
    c, d = hot()
    b = Budgets(horizon_s=60, min_benefit_ratio=2.0)
    h, slow = [Holding("p", "e0")], engines(link=0.5e9)  # a 10 s copy: 20 s to beat
    items = plan([c], [d], h, slow, b)
    assert items and all(i.expected_ttft_saved_s > 2 * i.cost_s for i in items)
    ledger = Ledger(prior_weight=5.0)
    for it in items * 100:
        # each copy was used by one request, and credited one prefill (its creditable maximum)
        ledger.add(Outcome(it.terms, 1, c.recompute_s))
    assert value.tally(ledger.outcomes())[(REPLICA, REQUESTS)].ratio < 0.05
    assert plan([c], [d], h, slow, b, calibration=ledger.calibration()) == []


def test_warm_up_and_promotion_terms_carry_the_model_and_its_correction():
    c, d = hot()
    joining = EngineState(
        "w", "nw", 100 * GB, 100 * GB, 0.0, 12.5e9, 0.0, ENGINE_WARMING, starts_serving_in_s=10
    )
    items = plan([c], [d], [Holding("p", "e0")], [*engines(1), joining], Budgets(horizon_s=60))
    warm = [i for i in items if i.target == "w"]
    assert warm and warm[0].terms.kind == WARM_UP
    x = warm[0].terms.requests
    assert warm[0].expected_ttft_saved_s == pytest.approx(3.0 * (1 - math.exp(-x)) * 0.9)
    cal = Calibration({(WARM_UP, REQUESTS): 0.5})
    again = plan(
        [c], [d], [Holding("p", "e0")], [*engines(1), joining], Budgets(horizon_s=60), None, cal
    )
    w2 = [i for i in again if i.target == "w"][0]
    assert w2.expected_ttft_saved_s == pytest.approx(0.5 * warm[0].expected_ttft_saved_s)
    e = [
        EngineState(
            "e0", "n0", 100 * GB, 100 * GB, 0, 12.5e9, 0.2, tier_bytes_per_s={TIER_CPU: 32e9}
        )
    ]
    promo = plan([c], [d], [Holding("p", "e0", TIER_CPU)], e)
    assert promo[0].terms.kind == value.PROMOTION
    assert promo[0].expected_ttft_saved_s == pytest.approx(promo[0].terms.value)


def test_decide_hands_the_correction_to_the_planner():
    c, d = hot()
    kw = dict(
        strategy=STRATEGY_PREDICTIVE,
        candidates=[c],
        demand=[d],
        holdings=[Holding("p", "e0")],
        engines=engines(),
        budgets=uncharged(horizon_s=60),
        overrides=Overrides(),
        guard=GuardState(),
    )
    raw = plan_moves(**kw).items
    cut = plan_moves(**kw, calibration=Calibration({(REPLICA, REQUESTS): 0.25})).items
    assert cut[0].expected_ttft_saved_s == pytest.approx(0.25 * raw[0].expected_ttft_saved_s)
