"""Copy priorities on a link, ramp-in routing of joining engines, and the speculation map."""

import json
import math

import numpy as np
import pytest

from controlplane.core.costmodel import CostModel
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.speculation_map import advice, load_map
from controlplane.sim.workloads.base import Workload


def _sim(engines=3):
    cost = CostModel.preset("llama3-8b", "h100", 1)
    cfg = ClusterConfig(cost, engines, 1000, network_bytes_per_s=1e9, link_latency_s=0.0)
    one = np.zeros(1)
    wl = Workload(
        "t", one, one.astype(np.int32), one.astype(np.int32), one.astype(np.int32), [(1,)], ["k"]
    )
    return Simulation(cfg, wl, make_policy("routing-reactive"))


def test_on_demand_copy_passes_a_speculative_one():
    sim = _sim()
    a, b, c = sim.engines
    bb = sim.block_bytes
    spec_land = sim.start_copy(1, (11, 12), a, b, 0.0, speculative=True)
    assert spec_land == pytest.approx(2 * bb / 1e9)
    demand_land = sim.start_copy(2, (21,), a, c, 0.0, speculative=False)
    assert demand_land == pytest.approx(bb / 1e9)  # not queued behind the speculative copy
    assert sim.spec_lands[0] == pytest.approx(3 * bb / 1e9)  # paused for the on-demand copy
    assert b.pending[11] == pytest.approx(3 * bb / 1e9)
    sim.events.run_until(2.5 * bb / 1e9)
    assert 11 not in b.cache  # has not landed at its original time
    sim.events.run_until(3 * bb / 1e9 + 1e-9)
    assert 11 in b.cache and 21 in c.cache


def test_speculation_map_advice(tmp_path):
    cells = [
        {
            "copy_to_onset": 0.01,
            "load": 0.3,
            "predictive_gain_p99": 0.0,
            "predictive_gain_mean": 0.0,
            "oracle_gain_p99": 0.01,
            "oracle_gain_mean": 0.0,
        },
        {
            "copy_to_onset": 1.0,
            "load": 0.8,
            "predictive_gain_p99": 0.3,
            "predictive_gain_mean": 0.1,
            "oracle_gain_p99": 0.35,
            "oracle_gain_mean": 0.1,
        },
        {
            "copy_to_onset": 1.0,
            "load": 0.3,
            "predictive_gain_p99": -0.2,
            "predictive_gain_mean": 0.0,
            "oracle_gain_p99": 0.0,
            "oracle_gain_mean": 0.0,
        },
    ]
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"noise": {"p99": 0.05, "mean": 0.02}, "cells": cells}))
    doc = load_map(p)
    assert advice(0.012, 0.35, doc)["verdict"] == "reactive-enough"
    a = advice(0.9, 0.75, doc)
    assert a["verdict"] == "speculate" and a["expected_gain_p99"] == 0.3
    assert advice(1.1, 0.25, doc)["verdict"] == "avoid"
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError):
            advice(bad, 0.5, doc)
    p.write_text("{}")
    with pytest.raises(ValueError):
        load_map(p)


def test_bundled_map_gives_each_measured_cell_its_own_verdict():
    """At a measured cell's coordinates the advice is that cell's, and its verdict follows the
    cell's own beyond-seed-noise findings (recorded by the seeded runs that built the map)."""
    doc = load_map()
    assert len(doc["cells"]) >= 2
    for cell in doc["cells"]:
        a = advice(cell["copy_to_onset"], cell["load"], doc)
        assert (a["cell"]["copy_to_onset"], a["cell"]["load"]) == (
            cell["copy_to_onset"],
            cell["load"],
        )
        assert a["expected_gain_p99"] == cell["predictive_gain_p99"]
        better = cell["predictive_gain_p99_beyond_noise"] and cell["predictive_gain_p99"] > 0
        worse = any(
            cell[f"predictive_gain_{s}_beyond_noise"] and cell[f"predictive_gain_{s}"] < 0
            for s in ("p99", "mean")
        )
        want = "avoid" if worse else "speculate" if better else "reactive-enough"
        assert a["verdict"] == want, (cell["copy_to_onset"], cell["load"], a)


def test_speculative_copy_needs_room_in_the_slice():
    sim = _sim()
    a, b, _ = sim.engines
    assert b.cache.spec_limit == 250  # 25% of 1000 blocks on a serving engine
    b.cache.use(list(range(1000, 1999)), 0.0)  # 999 of 1000 blocks are the engine's own
    b.queue.append((0.0, 100.0))  # ... and a request that is still running uses them
    assert sim.start_copy(1, (11, 12), a, b, 0.0, speculative=True) is None
    assert sim.bytes_moved == 0 and not b.pending
    assert sim.start_copy(1, (11,), a, b, 0.0, speculative=True) is not None
    # Once that request has finished, its blocks are cached but unreferenced: room.
    assert sim.start_copy(2, (21, 22), a, b, 101.0, speculative=True) is not None


def test_planned_copy_in_flight_does_not_hold_back_the_reactive_rule():
    sim = _sim()
    a, b, c = sim.engines
    keys = (1, 2, 3, 4)
    a.cache.use(keys, 0.0)
    sim.start_copy(7, keys, a, b, 0.0, speculative=True)  # a planned copy of prefix 7 to b
    a.free_at = 100.0  # the holder is swamped
    sim.policy._maybe_copy(sim, 0, 0.0, 7, keys)
    assert (7, c.eid) in sim.demand_in_flight  # the fallback still copies it to c
    sim.policy._maybe_copy(sim, 0, 0.0, 7, keys)
    assert len(sim.replicas) == 2  # and does not loop on its own copy


def test_gain_stats_and_per_cell_noise():
    from controlplane.sim.seeds import gain_stats

    g = gain_stats([1.0, 1.0, 1.0], [0.9, 0.8, 0.7])
    assert g["per_seed"] == pytest.approx([0.1, 0.2, 0.3])
    # mean 0.2, stdev 0.1, se 0.1/sqrt(3), t(2) = 4.302653 (the exact quantile)
    assert g["mean"] == pytest.approx(0.2) and g["noise"] == pytest.approx(
        4.302653 * 0.1 / 3**0.5, rel=1e-6
    )
    assert not g["beyond_noise"]
    assert gain_stats([2.0, 2.0], [1.0, 1.0])["beyond_noise"]  # no spread at all
    assert gain_stats([1.0], [0.5])["noise"] is None
    with pytest.raises(ValueError):
        gain_stats([1.0], [])
    cell = {
        "copy_to_onset": 0.1,
        "load": 0.8,
        "predictive_gain_p99": -0.05,
        "predictive_gain_mean": 0.0,
        "oracle_gain_p99": 0.0,
        "oracle_gain_mean": 0.0,
        "predictive_gain_p99_noise": 0.10,
        "predictive_gain_mean_noise": 0.02,
    }
    doc = {"noise": {"p99": 0.01, "mean": 0.01}, "cells": [cell]}
    a = advice(0.1, 0.8, doc)
    assert a["verdict"] == "reactive-enough" and a["noise_p99"] == 0.10  # the cell's own noise
    cell["predictive_gain_p99_noise"] = 0.02
    assert advice(0.1, 0.8, doc)["verdict"] == "avoid"
