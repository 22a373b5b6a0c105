"""Copy priorities on a link, ramp-in routing of joining engines, and the speculation map."""

import json
import math

import numpy as np
import pytest

from controlplane.core.costmodel import CostModel
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.policies import make_policy
from controlplane.sim.speculation_map import advice, load_map
from controlplane.sim.workloads.base import Workload


def _sim(engines=3):
    cost = CostModel.preset("llama3-8b", "h100", 1)
    cfg = ClusterConfig(cost, engines, 1000, network_bytes_per_s=1e9, link_latency_s=0.0)
    one = np.zeros(1)
    wl = Workload("t", one, one.astype(np.int32), one.astype(np.int32), one.astype(np.int32),
                  [(1,)], ["k"])
    return Simulation(cfg, wl, make_policy("reactive"))


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
        {"copy_to_onset": 0.01, "load": 0.3, "predictive_gain_p99": 0.0,
         "predictive_gain_mean": 0.0, "oracle_gain_p99": 0.01, "oracle_gain_mean": 0.0},
        {"copy_to_onset": 1.0, "load": 0.8, "predictive_gain_p99": 0.3,
         "predictive_gain_mean": 0.1, "oracle_gain_p99": 0.35, "oracle_gain_mean": 0.1},
        {"copy_to_onset": 1.0, "load": 0.3, "predictive_gain_p99": -0.2,
         "predictive_gain_mean": 0.0, "oracle_gain_p99": 0.0, "oracle_gain_mean": 0.0},
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


def test_bundled_map_loads():
    doc = load_map()
    assert doc["cells"] and advice(0.1, 0.5, doc)["verdict"] in ("speculate", "reactive-enough",
                                                                  "avoid")
