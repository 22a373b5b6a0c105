"""The simulator's feed to the value model's correction (``controlplane.sim.valued``): each
planned copy is watched over the horizon its value was modelled for, its hits and credit are its
outcome, and the plan rounds apply the correction the outcomes call for."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.core.costmodel import CostModel
from controlplane.core.policy.value import KINDS, REPLICA, REQUESTS, SAVING, Outcome, ValueTerms
from controlplane.sim.cluster import Simulation
from controlplane.sim.config import ClusterConfig
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.valued import SimValues
from controlplane.sim.workloads.base import Workload

TERMS = ValueTerms(REPLICA, requests=50.0, saving_s=2.0, discount=0.5)


def test_a_copy_s_hits_in_its_window_are_its_outcome_credited_one_prefill():
    v = SimValues()
    v.record(terms=TERMS, prefix=7, engine=1, lands_at=4.0, ends_at=100.0, one_prefill_s=2.0)
    v.record(terms=TERMS, prefix=7, engine=2, lands_at=None, ends_at=100.0, one_prefill_s=2.0)
    v.served(7, 1, 3.0, whole=True)  # before it landed: not its
    v.served(7, 1, 5.0, whole=True)
    v.served(7, 1, 6.0, whole=True)
    v.served(7, 1, 7.0, whole=False)  # served without the prefix: no hit
    v.served(8, 1, 8.0, whole=True)  # another prefix
    v.close(50.0)
    assert v.stats()["copies"] == 0  # its window is still open
    v.served(7, 1, 120.0, whole=True)  # after its window: not counted
    v.close(100.0)
    s = v.stats()
    assert s["copies"] == 1  # the copy that never started has no outcome
    rows = {(r["kind"], r["term"]): r for r in s["terms"]}
    assert (
        rows[(REPLICA, REQUESTS)]["measured"] == 2 and rows[(REPLICA, REQUESTS)]["modelled"] == 50
    )
    assert rows[(REPLICA, SAVING)]["measured"] == 2.0 and rows[(REPLICA, SAVING)]["modelled"] == 4
    assert s["ratio"] == pytest.approx(2.0 / TERMS.value)
    assert rows[(REPLICA, REQUESTS)]["factor"] < 1.0  # corrected runs show the factor in use
    assert SimValues(correct=False).calibration() is None


def _hot(n=6000, gap=0.02, blocks=128):
    """One 2,048-token prefix at 50 requests/s: more than its first holder takes."""
    t = np.arange(n) * gap
    z = np.zeros(n, dtype=np.int32)
    prefix = tuple(range(1, blocks + 1))
    return Workload("hot", t, z, np.full(n, 200, dtype=np.int32), z, [prefix], ["p"])


def _run(name: str, inflated: bool):
    cost = CostModel.preset("llama3-70b", "h100", 4)
    cfg = ClusterConfig(cost, 4, 4096, network_bytes_per_s=2e9, link_latency_s=0.0)
    policy = make_policy(name)
    if inflated:  # earlier outcomes: every kind of item saved next to nothing of its model
        for kind in KINDS:
            for _ in range(400):
                terms = ValueTerms(kind, 100.0, 10.0)
                policy.values.ledger.add(Outcome(terms, 1, 0.001))
    return Simulation(cfg, _hot(), policy).run()


def test_the_simulated_plan_rounds_apply_the_correction():
    assert _run("reactive", inflated=False).plan_items >= 1
    # The same outcomes, corrected: the model's items no longer beat their cost.
    assert _run("reactive", inflated=True).plan_items == 0
    # ... and not corrected, the same items as without them.
    assert _run("reactive-uncorrected", inflated=True).plan_items >= 1
