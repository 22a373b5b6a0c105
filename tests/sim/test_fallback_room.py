"""The room an on-demand copy takes: the reactive baseline keeps every block its target used
within the value horizon; predictive's fallback weighs that room by measured demand, the
currency of its own saving, so a prefix queueing on its holders displaces blocks nobody is
asking for however recently they were used, and never blocks that are asked for."""

import numpy as np
import pytest

from controlplane.core.costmodel import CostModel
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.workloads.base import Workload

HOT = (1, 2, 3, 4)  # prefix 0: queueing on its one holder
CAPACITY = 1000
OTHER = tuple(range(1000, 1000 + CAPACITY))  # prefix 1: fills the target's cache


def _sim(policy: str) -> Simulation:
    cost = CostModel.preset("llama3-8b", "h100", 1)
    cfg = ClusterConfig(cost, 2, CAPACITY, network_bytes_per_s=1e9, link_latency_s=0.0)
    one = np.zeros(1)
    wl = Workload(
        "t",
        one,
        one.astype(np.int32),
        one.astype(np.int32),
        one.astype(np.int32),
        [HOT, OTHER],
        ["hot", "other"],
    )
    return Simulation(cfg, wl, make_policy(policy))


def _swamped(sim: Simulation, other_requests: int):
    holder, target = sim.engines
    holder.cache.use(HOT, 0.0)
    holder.free_at = 100.0  # its queue: far above the rule's threshold and twice the copy time
    target.cache.use(OTHER, 1.0)  # the target's whole cache, used a second ago, unreferenced
    for i in range(other_requests):  # arrivals of prefix 1 the policy has counted
        sim.policy._count(1, 1.0 - i * 1e-3)
    for _ in range(5):  # prefix 0's arrivals, each running the rule
        sim.policy._count(0, 1.0)
    sim.policy._maybe_copy(sim, 0, 1.0, 0, HOT)
    return target


def test_reactive_keeps_the_recently_used_room():
    sim = _sim("reactive")
    target = _swamped(sim, other_requests=0)
    assert not sim.demand_in_flight and not target.pending  # refused: every block is recent


def test_predictive_fallback_takes_room_no_measured_demand_holds():
    sim = _sim("predictive")
    target = _swamped(sim, other_requests=0)
    assert (0, target.eid) in sim.demand_in_flight
    assert set(target.pending) == set(HOT)


@pytest.mark.parametrize("policy", ["predictive", "reactive"])
def test_no_fallback_displaces_room_its_measured_demand_holds(policy):
    """Prefix 1 asked for far more than prefix 0: its blocks are worth more than the copy saves."""
    sim = _sim(policy)
    target = _swamped(sim, other_requests=200_000)
    assert not sim.demand_in_flight and not target.pending
