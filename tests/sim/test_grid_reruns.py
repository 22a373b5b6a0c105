"""Rerunning some policies of grid jobs (`prewarm-sim grid --runs-only`) and merging them beside
the untouched ones (`prewarm-sim merge-runs`)."""

import json

from controlplane.sim.cli import main
from controlplane.sim.grid import merge_runs


def _pol(p99, mean=1.0):
    return {"ttft_p99_s": p99, "ttft_mean_s": mean}


def _row(cell, seed, **policies):
    return {"cell": cell, "seed": seed, "policies": policies}


BASE = [
    _row("c", 0, reactive=_pol(2.0), predictive=_pol(3.0), oracle=_pol(3.0)),
    _row("c", 1, reactive=_pol(2.0), predictive=_pol(3.0), oracle=_pol(3.0)),
]


def test_a_rerun_replaces_its_policies_and_keeps_the_others():
    merged = merge_runs(BASE, [_row("c", 0, predictive=_pol(1.5))])
    assert len(merged) == 1  # seed 1 has no rerun: left out, not mixed
    pols = merged[0]["policies"]
    assert pols["predictive"] == _pol(1.5)
    assert pols["reactive"] == _pol(2.0)  # untouched by the change: the base's


def test_a_base_from_before_the_rename_keeps_its_routing_rule_beside_the_rerun_reactive():
    rerun = [_row("c", 0, reactive=_pol(1.8), predictive=_pol(1.5), **{"hot-fanout": _pol(2.5)})]
    pols = merge_runs(BASE, rerun, {"reactive": "routing-reactive"})[0]["policies"]
    assert pols["routing-reactive"] == _pol(2.0)  # the base's reactive was the routing-time rule
    assert pols["reactive"] == _pol(1.8) and pols["hot-fanout"] == _pol(2.5)  # new ones join
    assert set(pols) == {"routing-reactive", "reactive", "predictive", "hot-fanout"}


def test_an_old_records_oracle_is_dropped_not_carried_as_a_bound():
    merged = merge_runs(BASE, [_row("c", 0, predictive=_pol(1.5), clairvoyant=_pol(1.2, 0.5))])
    assert "oracle" not in merged[0]["policies"]  # the better of the runs bounds nothing


def test_runs_only_then_merge_runs_from_the_command_line(tmp_path):
    base, rerun, out = tmp_path / "base.jsonl", tmp_path / "rerun.jsonl", tmp_path / "out.jsonl"
    job = ["--cells", "mooncake:llama3-8b:steady", "--seeds", "0", "--duration", "300"]
    job += ["--warmup", "60"]
    assert main(["grid", *job, "--jsonl", str(base)]) == 0
    (old,) = [json.loads(x) for x in base.read_text().splitlines()]
    stale = {**old, "policies": {**old["policies"], "predictive": _pol(99.0)}}
    base.write_text(json.dumps(stale) + "\n")  # as if a change had made predictive stale
    assert main(["grid", *job, "--policies", "predictive", "--runs-only"]) == 2  # no --jsonl
    assert (
        main(["grid", *job, "--policies", "predictive", "--runs-only", "--jsonl", str(rerun)]) == 0
    )
    assert main(["merge-runs", str(base), str(out), str(rerun)]) == 0
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    got, was = row["policies"], old["policies"]
    assert got["reactive"] == was["reactive"]  # not rerun: the base's, kept
    assert got["predictive"]["ttft_p99_s"] == was["predictive"]["ttft_p99_s"]  # stale one replaced
