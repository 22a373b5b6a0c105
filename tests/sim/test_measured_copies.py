"""A plan item measured demand asks for lands in the simulator as ordinary cache, outside the
engine's speculative slice, queued on the links like the plan's speculative copies; a
speculative item of the same prefix does not fit the slice and moves nothing."""

import numpy as np

from controlplane.core.costmodel import CostModel
from controlplane.core.policy.types import PlannedMove
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.planned_execute import execute
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.workloads.base import Workload
from wire.protocol import TIER_GPU

P = (1, 2, 3, 4)  # four blocks: over the slice of an 8-block engine at a quarter (2 blocks)


def _sim():
    cost = CostModel.preset("llama3-8b", "h100", 1)
    cfg = ClusterConfig(cost, 2, 8, network_bytes_per_s=1e9, link_latency_s=0.0, spec_fraction=0.25)
    one = np.zeros(1)
    wl = Workload(
        "t", one, one.astype(np.int32), one.astype(np.int32), one.astype(np.int32), [P], ["p"]
    )
    sim = Simulation(cfg, wl, make_policy("predictive"))
    sim.policy.setup(sim)
    sim.engines[0].cache.use(P, 0.0)
    return sim


def _item(measured: bool) -> PlannedMove:
    nbytes = len(P) * 1
    return PlannedMove(
        "0", P, "e0", "e1", TIER_GPU, nbytes, 0.0, 10.0, 0.1, 1.0, "test", None, measured
    )


def test_a_measured_item_lands_as_ordinary_cache_outside_the_slice():
    sim = _sim()
    dst = sim.engines[1]
    execute(sim.policy, sim, _item(measured=True), 1.0)
    assert dst.link_free_at > 1.0  # queued on the plan's lane, not the on-demand one
    assert not sim.demand_in_flight
    sim.events.run_until(60.0)
    assert dst.cache.match(P) == len(P)  # all four blocks, twice the slice
    assert not dst.cache.spec  # ordinary cache: no TTL, not counted as speculation


def test_a_speculative_item_of_the_same_prefix_does_not_fit_the_slice():
    sim = _sim()
    execute(sim.policy, sim, _item(measured=False), 1.0)
    sim.events.run_until(60.0)
    assert sim.engines[1].cache.match(P) == 0 and not sim.replicas
