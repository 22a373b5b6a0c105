"""Honest measurement: the warm-up cut, load calibrated at the peak, the load estimate from
t = 0, saturated seeds flagged, and a single engine."""

import math
from pathlib import Path

import numpy as np
import pytest

from controlplane.core.costmodel import CostModel
from controlplane.sim.cli import main
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.grid import summarize as grid_summary
from controlplane.sim.metrics import summarize
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.scenarios import build, offered_load
from controlplane.sim.seeds import seeds_text, summarize_cell
from controlplane.sim.workloads.base import Workload

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
SG = dict(
    trace=str(FIX / "servegen"), fmt="servegen", start=86400 * 2 + 7200, duration=1800, tenants=2
)


def test_warmup_leaves_the_cold_start_out():
    s = build(engines=4, **SG)
    r = Simulation(s.config, s.workload, make_policy("cache-aware")).run()
    cap = s.config.kv_capacity_blocks * s.config.block_bytes * 4
    whole = summarize(r, cap, 1800)
    cut = summarize(r, cap, 1800, warmup_s=300)
    late = s.workload.t >= 300
    assert cut["requests"] == int(late.sum()) < whole["requests"]
    assert cut["ttft_mean_s"] == pytest.approx(float(r.ttft[late].mean()))
    assert cut["whole_run"]["requests"] == len(s.workload)
    with pytest.raises(ValueError, match="warm-up"):
        summarize(r, cap, 1800, warmup_s=1e6)


def test_load_is_calibrated_at_the_busiest_five_minutes():
    for seed in (0, 1):
        s = build(engines=4, load=0.5, prefix_tokens=(8192, 131072), seed=seed, **SG)
        ol = offered_load(s.config, s.workload)
        assert ol["peak_5min"] == pytest.approx(0.5, rel=0.35)  # the draw, around the target
        assert ol["mean"] <= ol["peak_5min"]
        assert "busiest 5 minutes" in s.assumptions["load"]


def test_load_estimate_is_right_from_the_start():
    cost = CostModel.preset("llama3-8b", "h100", 1)
    one = np.zeros(1)
    wl = Workload(
        "t", one, one.astype(np.int32), one.astype(np.int32), one.astype(np.int32), [(1,)], ["k"]
    )
    sim = Simulation(ClusterConfig(cost, 2, 100), wl, make_policy("cache-aware"))
    # Both engines busy half of the first 10 s: the estimate reads ~0.5, not 10/60 of it.
    for k in range(10):
        sim._add_work(float(k), 1.0)
    assert sim.load(10.0) == pytest.approx(0.5, rel=0.1)
    assert math.isfinite(sim.load(0.0))


def test_one_engine_works(capsys):
    assert (
        main(
            [
                "run",
                "--trace",
                str(FIX / "mooncake_head300.jsonl"),
                "--format",
                "mooncake",
                "--engines",
                "1",
                "--model",
                "llama3-8b",
                "--warmup",
                "0",
                "--policies",
                "cache-aware,reactive,predictive,everywhere",
            ]
        )
        == 0
    )
    assert "reactive" in capsys.readouterr().out
    with pytest.raises(ValueError, match="scaleout"):
        build(engines=1, scenario="scaleout", **SG)


def _run(seed, reactive, other, sat=False, peak=0.5, ceiling=0.5):
    pol = {
        "ttft_mean_s": reactive,
        "ttft_p99_s": reactive,
        "saturated": sat,
        "spec_vram_fraction_mean": 0.0,
        "replica_precision": None,
        "speculative_replicas": 0,
        "bytes_moved": 0,
    }
    return {
        "seed": seed,
        "offered_load": {"peak_5min": peak, "mean": peak / 2},
        "policies": {
            "reactive": pol,
            "predictive": {**pol, "ttft_mean_s": other, "ttft_p99_s": other},
            "everywhere": {**pol, "ttft_mean_s": ceiling / 4, "ttft_p99_s": ceiling},
        },
    }


def test_a_seed_is_never_left_out_by_one_policys_own_backlog():
    """Reactive ends seed 3 with 50 s queues (its own backlog: ``saturated`` in its run) and a
    peak offered load near 1, but the ceiling serves it at p99 0.7 s: it is measured."""
    runs = [_run(s, 1.0, 0.9) for s in range(3)] + [
        _run(3, 50.0, 24.0, sat=True, peak=0.99, ceiling=0.7)
    ]
    cell = summarize_cell(runs)
    assert cell["saturated_seeds"] == [] and cell["left_out"] == []
    assert cell["seeds_measured"] == [0, 1, 2, 3]
    g = grid_summary(runs)
    assert g["saturated_seeds"] == [] and g["worst_seed"]["seed"] in (0, 1, 2, 3)


def test_saturated_seeds_are_flagged_not_averaged():
    runs = [
        _run(0, 1.0, 0.9),
        _run(1, 1.0, 0.9),
        _run(2, 1.0, 0.91),
        _run(3, 50.0, 100.0, ceiling=40.0),
        _run(4, 1.0, 0.9, ceiling=12.0),
    ]
    cell = summarize_cell(runs)
    assert cell["saturated_seeds"] == [3, 4] and cell["gains_over"] == "unsaturated seeds"
    assert [x["seed"] for x in cell["left_out"]] == [3, 4]
    assert "everywhere p99 40.00 s > 10 s" in cell["left_out"][0]["why"]
    assert seeds_text(cell).startswith("3 of 5 (df 2); left out: seed 3 (everywhere p99 40.00")
    assert cell["predictive_gain_p99"] == pytest.approx(0.0967, abs=1e-3)
    assert cell["predictive_gain_p99_beyond_noise"]
    assert cell["predictive_gain_p99_all_seeds"] < cell["predictive_gain_p99"]
    assert cell["ttft_s_noise"]["reactive"]["mean"] == pytest.approx(0.0)
