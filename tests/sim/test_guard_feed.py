"""The simulator's feed to the harm guard (``controlplane.sim.guarded``): requests served with
nothing of their prefix cached are classified by the control plane's miss reasons
(``core.misses``); ``evicted`` misses on a target that took a copy, and a ``warming`` miss before
a copy landed (its lead shorter than it), cut the next round's allowance, with the reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from controlplane.core import misses
from controlplane.core.policy import harm_guard
from controlplane.core.policy.spread import Narrowed
from controlplane.core.policy.types import Budgets, EngineState
from controlplane.core.prefix_cache import PrefixCache
from controlplane.core.residency_index import REMOVAL_WINDOW_S
from controlplane.sim.cluster import Simulation
from controlplane.sim.guarded import SimGuard
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.workloads.base import Workload
from tests.planner_settings import uncharged
from tests.sim.test_sim import _small


def _engines():
    return [EngineState(f"e{i}", f"n{i}", 1e10, 1e9, 0.0, 1e10, 0.0) for i in range(3)]


def _copied(prefix=7, planned_at=0.0, lands_at=4.0) -> SimGuard:
    """A guard watching one copy of ``prefix`` (group ``t0``) to e1, idle when planned."""
    g = SimGuard()
    g.record(
        target="e1",
        queue_before_s=0.0,
        group="t0",
        prefix=prefix,
        queues_at_plan={"e0": 0.0, "e1": 0.0, "e2": 0.0},
        planned_at=planned_at,
        lands_at=lands_at,
    )
    return g


def _miss(g: SimGuard, engine="e1", prefix=9, t=5.0, warming=False, removed_at=None) -> str:
    return g.miss(
        engine=engine, prefix=prefix, blocks=4, t=t, warming=warming, removed_at=removed_at
    )


def test_evicted_misses_on_a_target_that_took_a_copy_cut_its_allowance_and_say_why():
    g = _copied()
    for t in (5.0, 6.0):
        assert _miss(g, t=t, removed_at=4.5) == misses.EVICTED
    g.observe(10.0, _engines(), uncharged())
    assert g.state.engine("e1") == harm_guard.DECREASE and not g.state.groups
    out = harm_guard.summary(g.state)
    assert out["allowed"] == harm_guard.DECREASE
    assert "engine:e1 cut to 0.5: 2 misses on blocks evicted while it took copies" in out["why"]
    assert g.stats()["evicted_misses"] == 2 and g.stats()["harmful_rounds"] == 1


@pytest.mark.parametrize(
    "where",
    [
        {"engine": "e2", "removed_at": 4.5},  # an engine that took no copy
        {"removed_at": 5.0 - REMOVAL_WINDOW_S - 1.0},  # removed before the index's window
        {"removed_at": None},  # never removed: a cold miss
        {"removed_at": 4.5, "warming": True},  # a copy in flight comes first: warming
    ],
)
def test_misses_that_are_not_evicted_ones_on_a_copys_target_cut_nothing(where):
    g = _copied()
    for t in (5.0, 6.0):
        _miss(g, t=t, **where)
    g.observe(10.0, _engines(), uncharged())
    assert not g.state.engines and harm_guard.summary(g.state)["allowed"] == 1.0


def test_a_request_its_copy_was_for_served_before_it_landed_cuts_its_group():
    g = _copied(prefix=7, planned_at=0.0, lands_at=4.0)
    assert _miss(g, prefix=7, t=1.5, warming=True) == misses.WARMING
    g.observe(10.0, _engines(), uncharged())
    assert g.state.group("t0") == harm_guard.DECREASE and not g.state.engines
    why = harm_guard.summary(g.state)["why"]
    assert "group:t0 cut to 0.5: a copy took 4.0 s to land; a request it was for came 1.5 s" in why
    assert g.stats()["late_copies"] == 1


@pytest.mark.parametrize("where", [{"engine": "e2"}, {"prefix": 8}])
def test_a_warming_miss_of_another_copy_leaves_the_group_whole(where):
    g = _copied(prefix=7)
    _miss(g, **{"prefix": 7, "t": 1.5, "warming": True, **where})
    g.observe(10.0, _engines(), uncharged())
    assert not g.state.groups and g.stats()["late_copies"] == 0


def test_a_watched_cache_keeps_when_it_removed_each_watched_key():
    c = PrefixCache(3)
    c.watch({1, 5})
    c.use([1, 2], 0.0)
    c.use([3, 4, 5], 1.0)  # over capacity: the least recent (2, then 1) go
    assert c.removed_at == {1: 1.0} and 1 not in c
    c.place([6], 2.0, 0, speculative=True, expires_at=3.0)  # full: it displaces 3's leaf, 5
    assert c.removed_at == {1: 1.0, 5: 2.0}
    c.expire(3.0)
    assert c.removed_at == {1: 1.0, 5: 2.0} and 6 not in c  # 6 is not watched


def test_the_simulator_tells_the_policy_of_every_request_served_with_nothing_cached():
    """One engine of 8 blocks; prefixes A, B, C of 4 blocks each at t = 0, 10, 20, then A at 30
    and 31: C took A's room at 20, so A at 30 misses with its first block removed then; at 31 A
    is a hit (not told)."""
    cfg, _ = _small()
    one = dataclasses.replace(cfg, engines=1, kv_capacity_blocks=8)
    n = 5
    z = np.zeros(n, dtype=np.int32)
    prefixes = [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12)]
    w = Workload(
        "abca",
        np.array([0.0, 10.0, 20.0, 30.0, 31.0]),
        np.array([0, 1, 2, 0, 0], dtype=np.int32),
        z,
        z,
        prefixes,
        ["a", "b", "c"],
    )
    seen = []
    policy = make_policy("cache-aware")
    policy.on_miss = lambda sim, e, pid, keys, t: seen.append(
        (t, pid, e.cache.removed_at.get(keys[0]))
    )
    r = Simulation(one, w, policy).run()
    assert list(r.cached_tokens == 0) == [True, True, True, True, False]
    assert seen == [(0.0, 0, None), (10.0, 1, None), (20.0, 2, None), (30.0, 0, 20.0)]


def test_a_predictive_run_feeds_the_guard_its_miss_reasons():
    cfg, w = _small()
    r = Simulation(cfg, w, make_policy("predictive")).run()
    g = r.guard
    assert {"late_copies", "evicted_misses"} <= set(g) and g["rounds"] > 0


def test_predictive_classifies_its_misses_for_its_guard():
    """``predictive``'s miss hook gives its guard the simulated cluster's facts: a copy of the
    prefix to the engine in flight (``warming``), the engine's removal of its first block."""
    from controlplane.sim.planned import SIMULATED, PlannedPolicy

    cfg, w = _small()
    policy = PlannedPolicy("predictive", Budgets(**SIMULATED))
    policy.guard = _copied(prefix=7, planned_at=0.0, lands_at=4.0)
    sim = Simulation(dataclasses.replace(cfg, engines=3), w, policy)
    e1 = sim.engines[1]
    sim.in_flight[(7, 1)] = 4.0
    policy.on_miss(sim, e1, 7, (70, 71), 1.5)
    del sim.in_flight[(7, 1)]
    e1.cache.removed_at[90] = 4.5
    for t in (5.0, 6.0):
        policy.on_miss(sim, e1, 9, (90, 91), t)
    policy.on_miss(sim, e1, 8, (80, 81), 6.0)  # never removed, nothing in flight: not counted
    policy.guard.observe(10.0, _engines(), uncharged())
    s = policy.guard.state
    assert s.group("t0") == harm_guard.DECREASE and s.engine("e1") == harm_guard.DECREASE
    assert policy.guard.stats()["evicted_misses"] == 2
    assert PlannedPolicy("predictive", Budgets(**SIMULATED), guard=False).on_miss is None


def test_the_plans_a_concentration_signal_saw_are_counted_in_the_runs_guard_stats():
    g = SimGuard()
    g.spread([Narrowed("7", 1, 3, ("e1", "e2"), ("9->e1",)), Narrowed("8", 2, 3)])
    s = g.stats()
    assert (s["narrowed"], s["spread_restored"], s["spread_held_back"]) == (2, 2, 1)
