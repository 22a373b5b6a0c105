"""Does the live system reproduce the simulator's direction on the headline scale-out cell?

    python -m experiments.live_vs_sim.run --engines 4 --pairs 3 \\
        --jsonl experiments/live_vs_sim/passes.jsonl --json experiments/live_vs_sim/result.json

Pass pair ``k`` replays seed ``k`` of the ``headline`` preset (the grid's
``servegen:llama3-70b:scaleout`` cell, ``--engines`` of them, time-compressed 10x as the demo
is) once with the policy's strategy ``predictive`` and once ``reactive``, alternating which goes
first. Each pass is a fresh control plane started by the demo's own launcher
(``harness.demo --once``: migrations, policy, daphne with its embedded worker, the
virtual cluster and one real ``prewarm-agent`` per engine), stopped when the replay ends. Every
served request's TTFT comes from the cluster's served log; the control plane's plans, jobs and
copy landings from its database (``evidence.py``). The simulator runs the same seeds and
settings (``run_policies`` on the same ``build_preset`` set-up, the grid's 300 s warm-up).

``--jsonl`` keeps each finished pass (a rerun skips them); ``--sim-only`` runs the simulator
half alone. Run the live half under ``flock /work/wt/measure.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from experiments.live_vs_sim.evidence import live_evidence, sim_evidence
from experiments.live_vs_sim.figures import (
    WARMUP_S,
    agreement,
    compare,
    paired_gain,
    pass_figures,
    read_served,
)
from experiments.live_vs_sim.report import markdown
from harness.processes import REPO, free_port

STRATEGIES = ("predictive", "reactive")
PRESET = "headline"
HEADLINE_ENGINES, HEADLINE_TENANTS = 16, 30


def order_of(pair: int) -> tuple[str, str]:
    """Pair 0 runs predictive first, pair 1 reactive first, ...: drift over the session (the
    machine's load) does not favour one strategy."""
    return STRATEGIES if pair % 2 == 0 else STRATEGIES[::-1]


def tenants_for(engines: int) -> int:
    """The headline's 30 tenants on 16 engines, scaled with the fleet (tenants per engine kept:
    30 tenants' long prefixes on 4 engines overflow their KV and saturate them)."""
    return max(1, round(HEADLINE_TENANTS * engines / HEADLINE_ENGINES))


def setup_of(engines: int, tenants: int, seed: int):
    from harness.virtual.presets import build_preset

    setup, _ = build_preset(PRESET, engines=engines, tenants=tenants, seed=seed)
    return setup


def joins_of(setup) -> dict[int, float]:
    """Joining engine -> the trace second it starts serving."""
    return {ch.eid: ch.serve_s for ch in setup.config.changes}


def run_pass(
    seed: int, strategy: str, engines: int, tenants: int, root: Path, timeout_s: float, extra: dict
) -> dict:
    data = root / f"seed{seed}-{strategy}"
    # Every approved item copied (no holdout arm: the simulator has none), no hot fanout.
    fields = {**extra, "strategy": strategy, "hot_fanout": False, "holdout_fraction": 0}
    argv = [
        sys.executable,
        "-m",
        "harness.demo",
        "--preset",
        PRESET,
        "--engines",
        str(engines),
        "--tenants",
        str(tenants),
        "--seed",
        str(seed),
        "--once",
        "--data-dir",
        str(data),
        "--port",
        str(free_port()),
        "--policy-fields",
        json.dumps(fields),
    ]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"seed{seed}-{strategy}.log", "wb") as log:
        proc = subprocess.run(
            argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
        )
    wall = time.monotonic() - t0
    if proc.returncode:
        raise RuntimeError(f"pass seed {seed} {strategy} exited {proc.returncode}: see {log.name}")
    summary = json.loads((data / "cluster-summary.json").read_text())
    return {
        "seed": seed,
        "strategy": strategy,
        "engines": engines,
        "tenants": tenants,
        "policy_fields": extra,
        "figures": pass_figures(read_served(data / "served.csv")),
        "evidence": live_evidence(
            data / "prewarm.sqlite3",
            summary["started_at"],
            summary["time_scale"],
            joins_of(setup_of(engines, tenants, seed)),
        ),
        "cluster": {
            k: summary[k]
            for k in (
                "requests",
                "sim_seconds",
                "records_posted",
                "warmups",
                "replicas_placed",
                "replicas_used",
                "copies_in_blocks",
            )
        },
        "wall_s": round(wall, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def run_sim(seed: int, engines: int, tenants: int) -> dict:
    """Reactive and predictive in the simulator on the pass's set-up (figures + copies)."""
    from controlplane.sim.runner import run_policies

    setup = setup_of(engines, tenants, seed)
    joins = joins_of(setup)
    doc, results = run_policies(setup, list(STRATEGIES), seed=seed, warmup_s=WARMUP_S)
    return {
        name: {
            "seed": seed,
            "strategy": name,
            "figures": {
                k: doc["policies"][name][k] for k in ("requests", "ttft_mean_s", "ttft_p99_s")
            },
            "evidence": sim_evidence(results[name], joins),
        }
        for name in STRATEGIES
    }


# The simulator's predictive with one live input taken away at a time (``sim_variant``): what
# the live control plane lacks, to show which difference moves the direction.
VARIANTS = {
    # A fresh control plane has no demand history: no day-scale forecast, no yesterday's ramp,
    # no forecast-only candidates for joining engines.
    "predictive, no day history": {"history": False},
    # The live plan cycle runs every 10 wall s, 100 trace s at the demo's 10x (the sim's 15 s).
    "predictive, 100 s plan cycle": {"tick_s": 100.0},
    "predictive, both": {"history": False, "tick_s": 100.0},
}


def sim_variant(
    seed: int, engines: int, tenants: int, history: bool = True, tick_s: float = 15.0
) -> dict:
    """The simulator's predictive on the pass's set-up with the day history dropped and/or the
    plan tick changed; its figures."""
    from controlplane.sim.runner import run_policies
    from controlplane.sim.scenarios import Setup

    setup = setup_of(engines, tenants, seed)
    wl = setup.workload if history else dataclasses.replace(setup.workload, history={})
    doc, _ = run_policies(
        Setup(setup.config, wl, setup.assumptions),
        ["predictive"],
        seed=seed,
        options={"predictive": {"tick_s": tick_s}},
        warmup_s=WARMUP_S,
    )
    return {k: doc["policies"]["predictive"][k] for k in ("requests", "ttft_mean_s", "ttft_p99_s")}


def _done(jsonl: Path | None) -> list[dict]:
    if jsonl is None or not jsonl.exists():
        return []
    return [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", type=int, default=4, help="the fleet (the headline's is 16)")
    p.add_argument(
        "--tenants", type=int, default=None, help="default: 30 x engines / 16, the headline's share"
    )
    p.add_argument("--pairs", type=int, default=3, help="seeds 0..pairs-1, one pass per strategy")
    p.add_argument("--jsonl", type=Path, default=None, help="finished passes (resumable)")
    p.add_argument("--json", dest="json_path", type=Path, default=None)
    p.add_argument("--dir", type=Path, default=REPO / "var" / "live_vs_sim")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per pass")
    p.add_argument(
        "--policy-fields",
        type=json.loads,
        default={},
        help="JSON over the demo's policy for every pass (e.g. a faster plan cycle)",
    )
    p.add_argument(
        "--sim-only",
        action="store_true",
        help="the simulator's half, summarised with the passes --jsonl already holds",
    )
    p.add_argument(
        "--live-only", action="store_true", help="the live passes alone, into --jsonl (no summary)"
    )
    args = p.parse_args(argv)
    if args.engines < 2:
        p.error("--engines: the scale-out needs at least 2 (half of them join)")
    if args.pairs < 1:
        p.error("--pairs must be at least 1")
    if args.sim_only and args.live_only:
        p.error("--sim-only and --live-only exclude each other")
    if args.live_only and args.jsonl is None:
        p.error("--live-only keeps its passes in --jsonl: name one")
    seeds = list(range(args.pairs))
    tenants = args.tenants or tenants_for(args.engines)
    if not isinstance(args.policy_fields, dict):
        p.error("--policy-fields must be a JSON object")
    live = [
        r
        for r in _done(args.jsonl)
        if r["engines"] == args.engines
        and r.get("tenants") == tenants
        and r["seed"] in seeds
        and r.get("policy_fields", {}) == args.policy_fields
    ]
    if not args.sim_only:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for pair, seed in enumerate(seeds):
            for strategy in order_of(pair):
                if any(r["seed"] == seed and r["strategy"] == strategy for r in live):
                    continue
                r = run_pass(
                    seed,
                    strategy,
                    args.engines,
                    tenants,
                    args.dir / stamp,
                    args.timeout,
                    args.policy_fields,
                )
                r["order"] = len(live)
                live.append(r)
                if args.jsonl is not None:
                    with args.jsonl.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                print(json.dumps({k: r[k] for k in ("seed", "strategy", "figures")}), flush=True)
    if args.live_only:
        return 0
    sim = {s: run_sim(s, args.engines, tenants) for s in seeds}
    sim_passes = [sim[s][name] for s in seeds for name in STRATEGIES]
    variants = {}
    for name, kw in VARIANTS.items():
        figs = [sim_variant(s, args.engines, tenants, **kw) for s in seeds]
        variants[name] = {
            "figures": figs,
            "p99": paired_gain(
                [sim[s]["reactive"]["figures"]["ttft_p99_s"] for s in seeds],
                [f["ttft_p99_s"] for f in figs],
            ),
        }
    result = {
        "engines": args.engines,
        "tenants": tenants,
        "policy_fields": args.policy_fields,
        "seeds": seeds,
        "warmup_s": WARMUP_S,
        "sim": {stat: compare(sim_passes, stat) for stat in ("ttft_p99_s", "ttft_mean_s")},
        "sim_passes": sim_passes,
        "sim_variants": variants,
        "live_passes": live,
    }
    if any({r["strategy"] for r in live if r["seed"] == s} == set(STRATEGIES) for s in seeds):
        result["live"] = {stat: compare(live, stat) for stat in ("ttft_p99_s", "ttft_mean_s")}
        result["agreement_p99"] = agreement(
            result["live"]["ttft_p99_s"]["direction"], result["sim"]["ttft_p99_s"]["direction"]
        )
    if args.json_path:
        args.json_path.write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
