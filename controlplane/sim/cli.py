"""``prewarm-sim``: replay a trace on a simulated cluster under several policies.

prewarm-sim run --workload servegen --scenario slowlink --json out.json --html out.html
prewarm-sim sweep --json sweep.json --html sweep.html
prewarm-sim cluster --preset burst --control-plane URL ...  (virtual cluster: harness)
prewarm-sim seeds --seeds 0,1,2,3,4 --json seeds.json
"""

from __future__ import annotations

import argparse
import sys

from controlplane.sim.policies import POLICIES
from controlplane.sim.scenarios import FORMATS, SCENARIOS, WORKLOADS, build
from controlplane.sim.workloads.servegen import CLIENT_HALVES


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engines", type=int, default=16)
    p.add_argument(
        "--warmup",
        type=float,
        default=300.0,
        help="seconds at the start left out of the TTFT figures (default 300; "
        "whole-run figures are reported too)",
    )
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--gpus-per-engine", type=int, default=None)
    p.add_argument("--kv-capacity-gb", type=float, default=None, help="per engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load", type=float, default=0.55, help="target load (ServeGen rate scaling)")
    p.add_argument("--tenants", type=int, default=30)
    p.add_argument("--json", dest="json_path")
    p.add_argument("--html", dest="html_path")


def _clients(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--clients",
        choices=CLIENT_HALVES,
        default="all",
        help="ServeGen clients to build the workload from: all, or the tune or holdout half "
        "(split by a SHA-256 of the client name; each half scaled to --load on its own)",
    )


# The subcommands: each adds its parser to these.
_Subparsers = argparse._SubParsersAction


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="prewarm-sim", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for add in (_add_run, _add_sweep, _add_seeds, _add_grid, _add_merge_runs):
        add(sub)
    return ap


def _add_run(sub: _Subparsers) -> None:
    run = sub.add_parser("run", help="run policies on one workload and scenario")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--workload", choices=WORKLOADS, default="servegen")
    src.add_argument("--trace")
    src.add_argument("--trace-dir", help="a folder of ServeGen-format client files")
    run.add_argument("--format", dest="fmt", choices=FORMATS)
    run.add_argument("--scenario", choices=SCENARIOS, default="steady")
    run.add_argument("--policies", default=",".join(POLICIES))
    run.add_argument("--start", type=float, default=None, help="seconds into the trace")
    run.add_argument("--duration", type=float, default=None, help="seconds")
    run.add_argument("--time-scale", type=float, default=1.0)
    run.add_argument(
        "--prophet",
        action="store_true",
        help="let predictive's day-scale forecast choose Prophet too (slower)",
    )
    _clients(run)
    _common(run)


def _add_sweep(sub: _Subparsers) -> None:
    sw = sub.add_parser("sweep", help="map where speculation pays (heatmap)")
    sw.add_argument("--quick", action="store_true")
    sw.add_argument("--duration", type=float, default=1800.0)
    sw.add_argument("--seeds", default=None, help="comma-separated seeds (default: --seed)")
    sw.add_argument("--workers", type=int, default=1, help="worker processes")
    sw.add_argument("--trace-dir", help="a folder of ServeGen-format client files")
    _common(sw)


def _add_seeds(sub: _Subparsers) -> None:
    sd = sub.add_parser(
        "seeds", help="predictive vs reactive vs the everywhere ceiling over seeds, with noise"
    )
    sd.add_argument("--seeds", default="0,1,2,3,4")
    sd.add_argument(
        "--cells", default=None, help="model:scenario,... (default: the key ServeGen cells)"
    )
    sd.add_argument(
        "--policies",
        default="cache-aware,reactive,routing-reactive,hot-fanout,predictive,everywhere",
    )
    sd.add_argument("--duration", type=float, default=None, help="seconds (default 3600)")
    sd.add_argument("--load", type=float, default=0.55)
    sd.add_argument(
        "--warmup",
        type=float,
        default=300.0,
        help="seconds left out of the TTFT figures (default 300)",
    )
    sd.add_argument("--engines", type=int, default=16)
    sd.add_argument("--tenants", type=int, default=30)
    sd.add_argument("--trace-dir", help="a folder of ServeGen-format client files")
    _clients(sd)
    sd.add_argument("--workers", type=int, default=1, help="worker processes")
    sd.add_argument("--json", dest="json_path")


def _add_grid(sub: _Subparsers) -> None:
    gr = sub.add_parser("grid", help="do-no-harm grid: predictive vs reactive per cell")
    gr.add_argument(
        "--cells",
        default=None,
        help="setting:model:scenario,... (default: the one-axis grid; 'full': every trace, "
        "loads x fleets x tenants x scenarios x models)",
    )
    gr.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    gr.add_argument(
        "--policies",
        default="reactive,predictive,everywhere",
        help="with everywhere: gap closed against it per cell",
    )
    gr.add_argument("--duration", type=float, default=1200.0)
    gr.add_argument("--warmup", type=float, default=300.0)
    gr.add_argument("--workers", type=int, default=1)
    gr.add_argument("--trace-dir", help="a folder of ServeGen-format client files")
    _clients(gr)
    gr.add_argument("--jsonl", help="append each job's result here; jobs already there are skipped")
    gr.add_argument("--json", dest="json_path")
    gr.add_argument(
        "--summarize-only", action="store_true", help="tables of the jobs already in --jsonl"
    )
    gr.add_argument(
        "--runs-only",
        action="store_true",
        help="run (and append to --jsonl) any --policies, no tables: rerun some policies of "
        "grid jobs, then merge-runs puts them beside the others",
    )


def _add_merge_runs(sub: _Subparsers) -> None:
    mr = sub.add_parser(
        "merge-runs",
        help="grid JSONL with some policies rerun: a rerun's policies replace the base's",
    )
    mr.add_argument("base", help="the grid JSONL the reruns update")
    mr.add_argument("out", help="where the merged JSONL goes (seeds no rerun holds are left out)")
    mr.add_argument("reruns", nargs="+", help="JSONL files of `grid --runs-only`")
    mr.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="rename a policy of the base first (repeat): reactive=routing-reactive for records "
        "made before the routing-time rule was renamed",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "sweep":
            from controlplane.sim.sweep import main_sweep

            return main_sweep(args)
        if args.cmd == "grid":
            from controlplane.sim.grid import main_grid

            return main_grid(args)
        if args.cmd == "merge-runs":
            from controlplane.sim.grid import main_merge_runs

            return main_merge_runs(args)
        if args.cmd == "seeds":
            from controlplane.sim.seeds import main_seeds

            return main_seeds(args)
        return _run(args)
    except ValueError as exc:
        print(f"prewarm-sim: error: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from controlplane.sim.planned import UNCORRECTED
    from controlplane.sim.report import table, write_html, write_json
    from controlplane.sim.runner import run_policies

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES and p not in UNCORRECTED]
    if unknown or not policies:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    if args.trace and not args.fmt:
        raise ValueError("--trace needs --format")
    setup = build(
        workload=None if args.trace or args.trace_dir else args.workload,
        trace=args.trace,
        fmt=args.fmt,
        trace_dir=args.trace_dir,
        scenario=args.scenario,
        engines=args.engines,
        model=args.model,
        gpu=args.gpu,
        gpus_per_engine=args.gpus_per_engine,
        kv_capacity_gb=args.kv_capacity_gb,
        start=args.start,
        duration=args.duration,
        time_scale=args.time_scale,
        load=args.load,
        tenants=args.tenants,
        seed=args.seed,
        clients=args.clients,
    )
    options = {"predictive": {"use_prophet": True}} if args.prophet else {}
    setup.assumptions["predictive_day_forecast"] = (
        "per key, the best of last value, EWMA, seasonal naive, seasonal blend"
        + (" and Prophet" if args.prophet else "")
        + " by rolling-origin backtest (MASE)"
    )
    if args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    doc, results = run_policies(
        setup,
        policies,
        seed=args.seed,
        progress=sys.stderr.isatty(),
        options=options,
        warmup_s=args.warmup,
    )
    print(table(doc))
    if args.json_path:
        write_json(doc, args.json_path)
    if args.html_path:
        write_html(doc, results, setup.workload, args.html_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
