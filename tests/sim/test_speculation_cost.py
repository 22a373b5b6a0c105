"""Issue 20: speculation charged what it takes (queue back-off, margin, displaced value), the
``hot-fanout`` baseline, ``--trace-dir``, and the everywhere ceiling."""

import shutil

import numpy as np
import pytest

from controlplane.core.costmodel import CostModel
from controlplane.core.policy.planner import plan
from controlplane.core.policy.reactive import HOT_MAX_REPLICAS
from controlplane.core.policy.types import Candidate, Demand, EngineState, Holding
from controlplane.sim.cli import main
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.runner import run_policies
from controlplane.sim.scenarios import build, bundled_path
from controlplane.sim.workloads.base import Workload
from tests.planner_settings import uncharged
from wire.protocol import TIER_GPU

GB = 1e9


def _engines(queue=(0.0,) * 4, displaced=0.0, warming=()):
    return [
        EngineState(
            f"e{i}",
            f"n{i}",
            100 * GB,
            100 * GB,
            0.0,
            12.5e9,
            0.3,
            "warming" if i in warming else "serving",
            30.0 if i in warming else 0.0,
            {},
            0.0,
            0.0 if i in warming else q,
            displaced,
        )
        for i, q in enumerate(queue)
    ]


def _hot():
    # 5 GB prefix (0.4 s to copy), recompute 2 s, far more demand than its one holder takes.
    c = Candidate("p", (1, 2, 3), 3 * 512, int(5 * GB), "w", 0.1, 2.0)
    d = Demand("p", 600.0, 0.0, 0.0, 1.0)
    return c, d, [Holding("p", "e0", TIER_GPU)]


def test_planner_backs_off_while_the_cluster_queues_but_still_warms_joining_engines():
    c, d, h = _hot()
    b = uncharged(horizon_s=60, max_cluster_queue_s=1.0)
    assert plan([c], [d], h, _engines(), b)  # no queue: copies are planned
    busy = _engines(queue=(3.0, 3.0, 3.0, 0.0))  # serving engines queue 2.25 s on average
    assert plan([c], [d], h, busy, b) == []
    warm = _engines(queue=(3.0, 3.0, 3.0, 3.0), warming=(3,))
    items = plan([c], [d], h, warm, b)
    assert items and {it.target for it in items} == {"e3"}  # the warm-up only


def test_the_back_off_leaves_out_the_queue_of_the_prefixs_own_holders():
    # Its one holder queues 6 s (its own burst), the engines that could take a replica none:
    # the mean (1.5 s) is over the limit, but what queues is what a replica relieves.
    c, d, h = _hot()
    b = uncharged(horizon_s=60, max_cluster_queue_s=1.0)
    items = plan([c], [d], h, _engines(queue=(6.0, 0.0, 0.0, 0.0)), b)
    assert items and "e0" not in {it.target for it in items}
    # The same queue on an engine that does not hold it: the cluster queues, the planner waits.
    assert plan([c], [d], h, _engines(queue=(0.0, 6.0, 0.0, 0.0)), b) == []


def test_planner_skips_targets_that_queue_and_charges_their_queue():
    c, d, h = _hot()
    b = uncharged(horizon_s=60, max_queue_s=2.0)
    items = plan([c], [d], h, _engines(queue=(0.0, 5.0, 0.0, 0.0)), b)
    assert items and "e1" not in {it.target for it in items}
    # A target queueing 1.9 s: each spilled request saves 2.0 - 1.9 s, not the recompute.
    one = plan([c], [d], h, _engines(queue=(0.0, 1.9, 9.0, 9.0)), b)
    free = plan([c], [d], h, _engines(queue=(0.0, 0.0, 9.0, 9.0)), b)
    assert one[0].expected_ttft_saved_s < 0.1 * free[0].expected_ttft_saved_s


def test_planner_margin_and_displaced_value():
    c, _, h = _hot()
    # The holder takes 0.7 / 0.1 x 0.8 = 5.6 requests/s; 2 more in the minute spill, each
    # saving 2 s (~4 s), against a 0.4 s copy and 2 s of displaced value (5 GB x 0.4 s/GB):
    # worth it, but not by the margin of 2.
    d = Demand("p", (5.6 + 2 / 60) * 60, 0.0, 0.0, 1.0)
    es = _engines(displaced=0.4 / GB)
    assert plan([c], [d], h, es, uncharged(horizon_s=60))
    assert not plan([c], [d], h, es, uncharged(horizon_s=60, min_benefit_ratio=2.0))
    assert plan([c], [d], h, _engines(), uncharged(horizon_s=60, min_benefit_ratio=2.0))


def test_budgets_refuse_a_margin_below_one():
    with pytest.raises(ValueError):
        uncharged(min_benefit_ratio=0.5)


def _hot_workload(n=40, gap=0.1):
    t = np.arange(n) * gap
    P = tuple(range(1, 9))
    z = np.zeros(n, dtype=np.int32)
    return Workload("hot", t, z, np.full(n, 200, dtype=np.int32), z, [P], ["p"])


def test_hot_fanout_admits_at_its_heat_threshold_and_stops_at_two_replicas():
    cost = CostModel.preset("llama3-8b", "h100", 1)
    cfg = ClusterConfig(cost, 4, 64, network_bytes_per_s=25e9, link_latency_s=0.0)
    r = Simulation(cfg, _hot_workload(), make_policy("hot-fanout")).run()
    assert 1 <= len(r.replicas) <= HOT_MAX_REPLICAS - 1
    # 0.5 QPS stays under the 0.8 QPS admission: no fan-out at all.
    cold = Simulation(cfg, _hot_workload(n=10, gap=2.0), make_policy("hot-fanout")).run()
    assert not cold.replicas


def test_trace_dir_runs_any_folder_of_servegen_client_files(tmp_path, capsys):
    src = bundled_path("servegen")
    for f in sorted(src.glob("chunk-*-trace.csv"))[:12]:
        shutil.copy(f, tmp_path / f.name)
    s = build(trace_dir=str(tmp_path), scenario="steady", duration=600, tenants=4, seed=1)
    assert len(s.workload) > 0 and len(s.workload.prefixes) <= 4
    assert main(["run", "--trace-dir", str(tmp_path / "nope"), "--duration", "600"]) == 2
    assert "not a folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", "--trace-dir", str(empty), "--duration", "600"]) == 2


# The ceiling on a headline seed, sized for `make test`: the 70B scale-out cell's seed 0 with the
# headline's 20-minute window and 300 s warm-up (about a minute of CPU). `everywhere` is a run of
# its own (every prefix free on every engine), not a choice among the runs it is compared with,
# so predictive could come out ahead of it: this is a measurement, not a definition.
@pytest.mark.parametrize("seed", [0])
def test_everywhere_bounds_predictive_on_a_headline_seed(seed):
    setup = build(scenario="scaleout", model="llama3-70b", duration=1200, seed=seed)
    doc, _ = run_policies(setup, ["predictive", "everywhere"], seed=seed, warmup_s=300.0)
    p = doc["policies"]
    assert 0 < p["everywhere"]["ttft_p99_s"] <= p["predictive"]["ttft_p99_s"]
    with pytest.raises(ValueError, match="unknown policy 'oracle'"):
        run_policies(setup, ["oracle"], seed=seed)


def test_gap_closed_is_measured_against_everywhere_not_the_best_of_the_runs():
    from controlplane.sim.seeds import gap_closed, markdown, summarize_cell

    def run(seed, reactive, predictive, clairvoyant, everywhere):
        pols = {
            n: {
                "ttft_mean_s": v,
                "ttft_p99_s": v,
                "spec_vram_fraction_mean": 0.0,
                "replica_precision": None,
                "speculative_replicas": 0,
                "bytes_moved": 0,
            }
            for n, v in (
                ("reactive", reactive),
                ("predictive", predictive),
                ("clairvoyant", clairvoyant),
                ("everywhere", everywhere),
            )
        }
        return {"seed": seed, "offered_load": {"peak_5min": 0.5, "mean": 0.3}, "policies": pols}

    # Predictive beats clairvoyant on every seed: a bound taken as the better of the two would
    # put predictive at 100%. Against everywhere it closes (10-6 + 8-5) / (10-2 + 8-2) = 50%.
    cell = summarize_cell([run(0, 10.0, 6.0, 7.0, 2.0), run(1, 8.0, 5.0, 6.0, 2.0)])
    b = cell["gap_closed_p99_bootstrap"]
    assert b["against"] == "everywhere" and b["ratio"] == pytest.approx(0.5)
    assert cell["ceiling_beats_predictive_every_seed"]
    assert cell["clairvoyant_gain_p99"] < cell["predictive_gain_p99"]
    cell.update(model="llama3-70b", scenario="slowlink", gap_closed_p99=gap_closed(cell))
    head, _, row = markdown({"cells": [cell]}).splitlines()
    cols = [x.strip() for x in head.strip("|").split("|")]
    vals = dict(zip(cols, [x.strip() for x in row.strip("|").split("|")], strict=True))
    assert vals["gap closed p99 (vs everywhere)"].startswith("50% [")


def test_grid_appends_each_job_and_resumes_without_rerunning(tmp_path, capsys):
    out = tmp_path / "grid.jsonl"
    args = [
        "grid",
        "--cells",
        "mooncake:llama3-8b:steady",
        "--seeds",
        "0",
        "--duration",
        "300",
        "--warmup",
        "60",
        "--jsonl",
        str(out),
    ]
    assert main(args) == 0
    first = out.read_text()
    assert (
        len(first.splitlines()) == 1
        and "| mooncake | llama3-8b | steady |" in capsys.readouterr().out
    )
    assert main(args) == 0  # the job is there: nothing runs, nothing is appended
    assert out.read_text() == first
    assert main([*args[:2], "nope:llama3-8b:steady", *args[3:]]) == 2


def test_seeds_table_shows_hot_fanout_and_everywhere_where_they_ran():
    from controlplane.sim.seeds import markdown

    cell = {
        "model": "llama3-8b",
        "scenario": "steady",
        "seeds": [0, 1],
        "ttft_s": {
            n: {"mean": m, "p99": p}
            for n, m, p in (
                ("reactive", 0.066, 0.275),
                ("predictive", 0.059, 0.205),
                ("hot-fanout", 0.068, 0.297),
                ("everywhere", 0.057, 0.194),
            )
        },
        "predictive_gain_p99": 0.223,
        "predictive_gain_p99_noise": 1.62,
        "predictive_gain_p99_beyond_noise": False,
        "predictive_over_hot_fanout_p99": 0.26,
        "predictive_over_hot_fanout_p99_noise": 0.1,
        "predictive_over_hot_fanout_p99_beyond_noise": True,
        "spec_vram_fraction_mean": 0.0,
        "replica_precision": 1.0,
    }
    head, rule, row = markdown({"cells": [cell]}).splitlines()
    cols = [x.strip() for x in head.strip("|").split("|")]
    vals = dict(zip(cols, [x.strip() for x in row.strip("|").split("|")], strict=True))
    assert rule.count("---") == len(cols)
    assert vals["hot-fanout mean / p99"] == "0.068 / 0.297"
    assert vals["everywhere mean / p99"] == "0.057 / 0.194"
    assert vals["predictive over hot-fanout p99"] == "**+26.0%** ± 10.0%"
    without = {**cell, "ttft_s": {k: v for k, v in cell["ttft_s"].items() if k == "reactive"}}
    assert "hot-fanout" not in markdown({"cells": [without]}).splitlines()[0]
