"""Warm-ups the demo sends per strategy, with two days of history imported.

    PYTHONPATH=$PWD .venv/bin/python experiments/demo-warmups/run.py --preset burst \\
        --seconds 480 --port 9510 --json experiments/demo-warmups/burst.json

Starts ``make demo``'s own entry point (``harness.demo``: the control plane on the embedded
default, the virtual cluster, one real agent per engine; the cluster imports the trace's two
earlier days of history before its replay) once per strategy, side by side (each its own folder
under ``var/demo-warmups/`` and its own port: the same machine load for both), with the demo's
policy and only ``strategy`` changed. Each runs ``--seconds`` of replay after its history
import has landed, then is stopped as Ctrl-C stops it. What the control plane did is read from
its SQLite database afterwards: warm-up jobs by state and those that landed, plans and their
items by decision, each planned key's measured and forecast demand from the plans' summaries,
and the model each key's forecasts chose (first tick after the import, and over the run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path

from harness.processes import REPO, Proc

STRATEGIES = ("reactive", "predictive")
IMPORTED = re.compile(
    r"imported ([\d.]+) days of the trace's history: (\d+) requests in (\d+) rows"
)


def start(preset: str, strategy: str, port: int, root: Path, extra: list[str]) -> Proc:
    data = root / f"{preset}-{strategy}"
    shutil.rmtree(data, ignore_errors=True)  # the demo takes only an empty --data-dir
    (root / f"{preset}-{strategy}.log").unlink(missing_ok=True)  # a Proc's log is appended to
    argv = [sys.executable, "-m", "harness.demo", "--preset", preset, "--data-dir", str(data)]
    argv += ["--port", str(port), "--policy-fields", json.dumps({"strategy": strategy}), *extra]
    root.mkdir(parents=True, exist_ok=True)
    return Proc(
        strategy, argv, dict(os.environ), log_path=root / f"{preset}-{strategy}.log"
    ).start()


def imported(proc: Proc) -> dict | None:
    """The history import's line in the demo's log, once it is there."""
    m = IMPORTED.search(proc.tail(200_000))
    if m is None:
        return None
    return {"days": float(m[1]), "requests": int(m[2]), "rows": int(m[3])}


def run(args: argparse.Namespace) -> dict:
    root = REPO / "var" / "demo-warmups"
    extra = [*(["--engines", str(args.engines)] if args.engines else [])]
    extra += ["--tenants", str(args.tenants)] if args.tenants else []
    procs = {s: start(args.preset, s, args.port + i, root, extra) for i, s in enumerate(STRATEGIES)}
    began = time.time()
    replay_from: dict[str, float] = {}
    history: dict[str, dict] = {}
    loads: list[float] = []
    stopped: dict[str, float] = {}
    try:
        while len(stopped) < len(procs):
            for s, p in procs.items():
                if s in stopped:
                    continue
                if not p.alive():
                    raise RuntimeError(f"{s}: the demo exited ({p.returncode}): {p.tail(2000)}")
                if s not in replay_from and (h := imported(p)) is not None:
                    replay_from[s], history[s] = time.time(), h
                if s in replay_from and time.time() - replay_from[s] >= args.seconds:
                    p.stop(120.0, leader_first=True)  # as Ctrl-C: the cluster, then the web
                    stopped[s] = time.time()
            if time.time() - began > args.seconds + args.start_timeout_s:
                raise RuntimeError(f"no history import within {args.start_timeout_s} s")
            loads.append(os.getloadavg()[0])
            time.sleep(5.0)
    finally:
        for p in procs.values():
            p.stop(60.0, leader_first=True)
    out = {
        "preset": args.preset,
        "engines": args.engines,
        "tenants": args.tenants,
        "replay_seconds": args.seconds,
        "load_average_1min": {
            "min": round(min(loads), 1),
            "median": round(sorted(loads)[len(loads) // 2], 1),
            "max": round(max(loads), 1),
        },
        "cpus": os.cpu_count(),
        "strategies": {},
    }
    for s in STRATEGIES:
        data = root / f"{args.preset}-{s}"
        rec = evidence(data / "prewarm.sqlite3", replay_from[s], stopped[s])
        summary = data / "cluster-summary.json"
        cluster = json.loads(summary.read_text()) if summary.exists() else {}
        rec["cluster"] = {
            k: cluster.get(k)
            for k in ("requests", "sim_seconds", "warmups", "replicas_placed", "replicas_used")
        }
        rec["history_import"] = {**history[s], **(cluster.get("history") or {})}
        rec["replay_wall_s"] = round(stopped[s] - replay_from[s], 1)
        out["strategies"][s] = rec
    return out


def _epoch(text: str) -> float:
    from datetime import UTC, datetime

    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def evidence(db: Path, replay_from: float, stopped: float) -> dict:
    """What the control plane did, from its database: jobs, plans, items, demand parts and the
    forecasters' choices."""
    con = sqlite3.connect(db)
    try:
        jobs = con.execute(
            "SELECT j.state, j.transport, (SELECT COUNT(*) FROM replication_jobtransition t"
            " WHERE t.job_id = j.id AND t.to_state = 'landed') FROM replication_replicationjob j"
            " WHERE j.action = 'replicate'"
        ).fetchall()
        plans = con.execute(
            "SELECT p.id, p.summary FROM replication_replicationplan p ORDER BY p.id"
        ).fetchall()
        items = con.execute(
            "SELECT i.plan_id, i.decision, i.workload_key_id FROM replication_planitem i"
        ).fetchall()
        forecasts = con.execute(
            "SELECT f.key_id, f.model, f.generated_at FROM forecasting_forecast f ORDER BY f.id"
        ).fetchall()
    finally:
        con.close()
    return {
        "warmup_jobs": sum(1 for _, tr, _ in jobs if tr == "warmup"),
        "jobs_by_state": dict(Counter(st for st, _, _ in jobs)),
        "jobs_landed": sum(1 for _, _, landed in jobs if landed),
        **plan_figures(plans, items),
        **forecast_figures(forecasts, replay_from),
    }


def plan_figures(plans: list, items: list) -> dict:
    """Plans with items by trigger; items by decision; of the planned keys' demand parts in the
    summaries, how many had a measured part, a forecast part, and a forecast above measured."""
    trig: dict[int, str] = {}
    parts = Counter()
    for pid, summary in plans:
        s = json.loads(summary)
        trig[pid] = s.get("trigger", "cycle")
        for d in (s.get("demand") or {}).values():
            parts["keys"] += 1
            parts["measured"] += d["measured_per_s"] > 0
            parts["forecast"] += d["forecast_per_s"] > 0
            parts["both"] += d["measured_per_s"] > 0 and d["forecast_per_s"] > 0
            parts["forecast_only"] += d["measured_per_s"] <= 0 and d["forecast_per_s"] > 0
            parts["forecast_above_measured"] += d["forecast_per_s"] > d["measured_per_s"]
    with_items = Counter(trig[p] for p in {p for p, _, _ in items})
    example = next(
        (json.loads(s)["demand"] for _, s in reversed(plans) if json.loads(s).get("demand")), {}
    )
    return {
        "plans": len(plans),
        "plans_by_trigger": dict(Counter(trig.values())),
        "plans_with_items_by_trigger": dict(with_items),
        "items_by_decision": dict(Counter(d for _, d, _ in items)),
        "demand_parts_of_planned_keys": dict(parts),
        "last_plan_demand_example": dict(list(example.items())[:3]),
    }


def forecast_figures(forecasts: list, replay_from: float) -> dict:
    """The model each key's first forecast after the history import chose, and the choices over
    the whole run."""
    first: dict[int, str] = {}
    for key, model, at in forecasts:
        if key not in first and _epoch(at) >= replay_from - 30:
            first[key] = model
    return {
        "forecast_model_first_tick": dict(Counter(first.values())),
        "forecast_models_all_ticks": dict(Counter(m for _, m, _ in forecasts)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="burst")
    p.add_argument("--seconds", type=float, default=480.0, help="replay after the import")
    p.add_argument("--port", type=int, default=9510, help="reactive's; predictive's is one up")
    p.add_argument("--engines", type=int, default=None)
    p.add_argument("--tenants", type=int, default=None)
    p.add_argument("--start-timeout-s", type=float, default=900.0)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    out = run(args)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
