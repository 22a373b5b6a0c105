"""``predictive``'s fallback in the simulator is the live one (``plans.react.fallback``): a
prefix whose holder queues past the reactive rule is re-planned at ingest, through the planner
and the storm bound; nothing is copied at routing time, which the live control plane cannot do.
(A routing-time copy in the simulated predictive alone made it 1.46x the shipped reactive's p99
on a scale-out seed: experiments/client-halves.)"""

import numpy as np

from controlplane.core.costmodel import CostModel
from controlplane.core.policy.reactive import ReactiveRule, queue_fallback
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.workloads.base import Workload

KEYS = tuple(range(1, 41))  # 40 blocks


def test_the_rule_both_sides_call():
    rule = ReactiveRule()
    assert queue_fallback(rule, holder_waits_s=[10.0, 0.5], other_waits_s=[0.0], copy_s=1.0)
    # The wait saved must be over the threshold and over twice the copy.
    assert not queue_fallback(rule, holder_waits_s=[1.5], other_waits_s=[0.0], copy_s=1.0)
    assert not queue_fallback(rule, holder_waits_s=[10.0], other_waits_s=[9.5], copy_s=0.1)
    assert not queue_fallback(rule, holder_waits_s=[], other_waits_s=[0.0], copy_s=1.0)


def _arrival_at_a_swamped_holder(policy: str):
    cost = CostModel.preset("llama3-8b", "h100", 1)
    cfg = ClusterConfig(cost, 3, 1000, network_bytes_per_s=1e9, link_latency_s=0.0)
    one = np.zeros(1)
    ids = one.astype(np.int32)
    sim = Simulation(cfg, Workload("t", one, ids, ids, ids, [KEYS], ["k"]), make_policy(policy))
    sim.policy.setup(sim)
    a = sim.engines[0]
    a.cache.use(KEYS, 0.0)
    a.free_at = 100.0  # the only holder queues 100 s; the others are idle
    sim.policy._before(sim, 0, 1.0, 0, KEYS)
    return sim


def test_predictive_replans_a_queued_holders_prefix_and_copies_nothing_at_routing_time():
    sim = _arrival_at_a_swamped_holder("predictive")
    assert not sim.demand_in_flight  # no routing-time (on-demand) copy
    assert "0" in sim.policy.bound.replanned  # re-planned at ingest, as live


def test_reactive_does_neither():
    sim = _arrival_at_a_swamped_holder("reactive")
    assert not sim.demand_in_flight
    assert "0" not in sim.policy.bound.replanned  # one arrival: no measured demand to re-plan
