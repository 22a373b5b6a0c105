"""Workload loaders on cuts of the real traces, determinism, routers, and the CLI's JSON."""

import json
from pathlib import Path

import numpy as np
import pytest

from controlplane.core.costmodel import CostModel
from controlplane.sim.cli import main
from controlplane.sim.cluster import ClusterConfig, Simulation
from controlplane.sim.policies import POLICIES
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.scenarios import build
from controlplane.sim.workloads.azure import load_azure
from controlplane.sim.workloads.mooncake import load_mooncake
from controlplane.sim.workloads.servegen import load_servegen
from wire.protocol import TIER_CPU, TIER_DISK

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def test_mooncake_loader_uses_hash_ids_as_keys():
    w = load_mooncake(FIX / "mooncake_head300.jsonl")
    assert len(w) == 300 and w.t[0] == 0.0
    first = w.prefixes[w.pid[0]]
    assert first == tuple(range(13))  # 6758 tokens: 13 full 512-token blocks of ids 0..13
    assert w.suffix_tokens[0] == 6758 - 13 * 512


def test_azure_loader_assigns_documented_prefixes():
    a = load_azure(FIX / "azure_code_head300.csv", seed=1)
    b = load_azure(FIX / "azure_code_head300.csv", seed=1)
    assert len(a) == 300 and a.prefixes == b.prefixes
    tokens = a.input_tokens()
    assert tokens[0] == 4808  # the first row's ContextTokens, split into prefix + own tokens


def test_servegen_loader_renders_windows():
    w = load_servegen(FIX / "servegen", start=86400 * 2 + 7200, duration_s=3600, tenants=2, seed=0)
    assert len(w) > 0 and set(w.prefix_wkey) == {"chunk-1", "chunk-7"}
    assert all(
        len(h) == 2 * 144 + 12 for h in w.history.values()
    )  # two days and two hours before the start


def test_bad_traces_are_refused(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError):
        load_mooncake(bad)
    csvf = tmp_path / "x.csv"
    csvf.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError):
        load_azure(csvf)


def _small():
    w = load_mooncake(FIX / "mooncake_head300.jsonl")
    cost = CostModel.preset("llama3-8b", "h100", 1)
    return ClusterConfig(cost, 4, 400), w


def test_fifo_queueing_arithmetic():
    cfg, w = _small()
    w = w.window(0, 1e-9)  # the requests at t=0 only
    r = Simulation(cfg, w, make_policy("round-robin")).run()
    sim = Simulation(cfg, w, make_policy("round-robin"))
    # Round-robin over 4 engines: request i waits for request i-4 on the same engine.
    serv = [sim.prefill_s(int(x), 0) for x in w.input_tokens()]
    for i in range(4, len(w)):
        if r.cached_tokens[i] == 0 and r.cached_tokens[i - 4] == 0:
            assert r.ttft[i] == pytest.approx(r.ttft[i - 4] + serv[i])


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_is_deterministic(name):
    cfg, w = _small()
    a = Simulation(cfg, w, make_policy(name), seed=3).run()
    b = Simulation(cfg, w, make_policy(name), seed=3).run()
    assert np.array_equal(a.ttft, b.ttft) and a.bytes_moved == b.bytes_moved


def test_cache_aware_beats_random_and_everywhere_bounds_it():
    cfg, w = _small()
    res = {
        n: Simulation(cfg, w, make_policy(n)).run().ttft.mean()
        for n in ("random", "cache-aware", "everywhere")
    }
    assert res["everywhere"] <= res["cache-aware"] < res["random"]


def test_cli_run_json_shape(tmp_path):
    out = tmp_path / "r.json"
    html = tmp_path / "r.html"
    rc = main(
        [
            "run",
            "--trace",
            str(FIX / "mooncake_head300.jsonl"),
            "--format",
            "mooncake",
            "--engines",
            "4",
            "--model",
            "llama3-8b",
            "--warmup",
            "0",
            "--json",
            str(out),
            "--html",
            str(html),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc) >= {"workload", "cluster", "assumptions", "policies"}
    assert list(doc["policies"]) == list(POLICIES)
    for m in doc["policies"].values():
        assert set(m) >= {
            "requests",
            "ttft_mean_s",
            "ttft_p50_s",
            "ttft_p90_s",
            "ttft_p99_s",
            "hit_rate_tokens",
            "bytes_moved",
            "spec_vram_byte_seconds",
            "replica_precision",
            "wall_s",
        }
        assert m["requests"] == 300
    text = html.read_text()
    assert "TTFT CDF" in text and "<script src=" not in text  # plotly inlined, offline


def test_cli_refuses_bad_config(capsys):
    assert main(["run", "--workload", "mooncake", "--policies", "nope"]) == 2
    assert "unknown policies" in capsys.readouterr().err


def test_scaleout_and_tiered_setups_build():
    s = build(
        trace=str(FIX / "servegen"),
        fmt="servegen",
        scenario="scaleout",
        engines=4,
        start=86400 * 2 + 7200,
        duration=1800,
        tenants=2,
    )
    assert len(s.config.changes) == 2 and all(c.serve_s > c.announce_s for c in s.config.changes)
    t = build(
        trace=str(FIX / "mooncake_head300.jsonl"), fmt="mooncake", scenario="tiered", engines=4
    )
    assert [x.name for x in t.config.tiers] == [TIER_CPU, TIER_DISK]


def test_servegen_load_holds_for_every_seed():
    # The rate is scaled with the prefix lengths each seed draws, so the offered prefill work
    # (every request with its prefix cached) matches the target load whatever the draw.
    from controlplane.sim.workloads.base import BLOCK_TOKENS

    for seed in (0, 1, 2):
        s = build(
            trace=str(FIX / "servegen"),
            fmt="servegen",
            engines=4,
            start=86400 * 2 + 7200,
            duration=1800,
            tenants=2,
            load=0.5,
            prefix_tokens=(8192, 131072),
            seed=seed,
        )
        wl, cost = s.workload, s.config.cost
        work = sum(cost.prefill_s(700, len(wl.prefixes[p]) * BLOCK_TOKENS) for p in wl.pid.tolist())
        assert work / (1800 * 4) == pytest.approx(0.5, rel=0.3)
