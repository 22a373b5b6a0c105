"""Value-aware placement in the simulator: the fair reactive rule counts what its copy displaces
(and so cannot storm), the naive one does not; planned replicas are leased for the horizon."""

import math

import numpy as np

from controlplane.core.costmodel import CostModel
from controlplane.core.policy.reactive import ReactiveRule
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.workloads.base import Workload

P = (1, 2, 3, 4)  # the hot prefix whose holder is swamped
Q = (11, 12, 13, 14, 15, 16)  # another tenant's prefix, the only copy, on the would-be target


def _sim(policy, spec_fraction=0.25):
    cost = CostModel.preset("llama3-8b", "h100", 1)
    cfg = ClusterConfig(
        cost, 3, 8, network_bytes_per_s=1e9, link_latency_s=0.0, spec_fraction=spec_fraction
    )
    one = np.zeros(1)
    wl = Workload(
        "t",
        one,
        one.astype(np.int32),
        one.astype(np.int32),
        one.astype(np.int32),
        [P, Q],
        ["p", "q"],
    )
    sim = Simulation(cfg, wl, make_policy(policy))
    a, b, c = sim.engines
    a.cache.use(P, 0.0)
    b.cache.use(Q, 0.0)  # used at t = 0 by a request that has finished
    a.free_at = c.free_at = 300.0  # the holder (and the third engine) are swamped
    return sim, a, b


def _copy_at(sim, t):
    sim.policy._maybe_copy(sim, 0, t, 0, P)
    sim.events.run_until(t + 10.0)


def test_fair_reactive_does_not_evict_a_recently_used_only_copy():
    sim, a, b = _sim("routing-reactive")
    _copy_at(sim, 10.0)
    assert not sim.replicas and b.cache.match(Q) == len(Q)  # no copy: it would displace Q
    # Two minutes later Q has not been used since: its blocks are cold, the copy may take them.
    _copy_at(sim, 200.0)
    assert len(sim.replicas) == 1 and b.cache.match(P) == len(P)


def test_naive_reactive_evicts_it():
    sim, a, b = _sim("reactive-naive")
    _copy_at(sim, 10.0)
    assert len(sim.replicas) == 1 and b.cache.match(P) == len(P)
    assert b.cache.match(Q) < len(Q)  # the other tenant's only copy lost blocks


def test_a_planned_replica_is_leased_for_the_horizon():
    sim, a, b = _sim("routing-reactive", spec_fraction=1.0)
    land = sim.start_copy(0, P, a, b, 200.0, speculative=True, ttl_s=300.0, keep_s=120.0)
    sim.events.run_until(land + 1e-6)
    assert b.cache.match(P) == len(P) and set(P) <= set(b.cache.spec)
    b.cache.use((21, 22, 23), land + 1.0)  # the target's own traffic needs room
    assert b.cache.match(P) == len(P)  # the lease keeps the replica; cold Q went instead


def test_predictive_replans_a_bursts_onset_before_the_next_tick():
    # One tenant at 1/s for a minute, then 60/s: its holder cannot take that. The planner's
    # tick comes every 15 s (at 60 s and 75 s); the onset re-plan copies within seconds (the
    # reactive fallback is switched off to see the planner's own copies).
    cost = CostModel.preset("llama3-70b", "h100", 4)
    cfg = ClusterConfig(cost, 4, 1200, network_bytes_per_s=25e9)
    t = np.concatenate([np.arange(0.5, 60.0, 1.0), 60.2 + np.arange(0.0, 20.0, 1 / 60)])
    n = len(t)
    prefix = tuple(range(100, 356))  # 256 blocks, 128k tokens: ~20 s to recompute
    wl = Workload(
        "t",
        t,
        np.zeros(n, dtype=np.int32),
        np.full(n, 600, dtype=np.int32),
        np.full(n, 100, dtype=np.int32),
        [prefix],
        ["p"],
        duration_s=80.0,
    )
    pol = make_policy("predictive", reactive_rule=ReactiveRule(threshold_s=math.inf))
    r = Simulation(cfg, wl, pol).run()
    assert pol.bound.replans >= 1
    landed = sorted(x.placed_at for x in r.replicas if x.speculative and x.pid == 0)
    assert landed and 60.2 < landed[0] < 64.0, landed
    assert r.replica_used and all(r.replica_used.values())
