"""``prewarm-sim``: the simulator's commands (``controlplane/sim/cli.py``) and ``cluster``, which
runs the virtual cluster (``virtual/``) against a control plane.

    prewarm-sim cluster --preset burst --control-plane http://127.0.0.1:8000 \\
        --gateway-token pwg_... --operator-token pwu_... --dir var/vcluster \\
        --spawn-agents --enrolment-tokens tok1,tok2,...

Tokens may come from the environment instead (``PREWARM_GATEWAY_TOKEN``,
``PREWARM_OPERATOR_TOKEN``, ``PREWARM_ENROLMENT_TOKENS``). Without ``--spawn-agents`` it writes
the agents' configurations (``<dir>/<node>/agent.toml``) and waits for agents started elsewhere.
``<dir>/ready.json`` appears once the sockets are bound and the configurations written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path


def cluster_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prewarm-sim cluster",
        description="play the simulator's engines in real time for real agents",
    )
    add_arguments(p)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``prewarm-sim``'s arguments: ``cluster ...`` here, the rest by the simulator's parser."""
    if argv[:1] == ["cluster"]:
        args = cluster_parser().parse_args(argv[1:])
        args.cmd = "cluster"
        return args
    from controlplane.sim.cli import parser

    return parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``prewarm-sim cluster ...`` here; every other command is the simulator's own."""
    from controlplane.sim.cli import main as sim_main

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["cluster"]:
        if argv[:1] in (["-h"], ["--help"]):
            print("prewarm-sim cluster --help: the virtual cluster (a live demo's engines)\n")
        return sim_main(argv)
    args = parse_args(argv)
    try:
        return main_cluster(args)
    except ValueError as exc:
        print(f"prewarm-sim: error: {exc}", file=sys.stderr)
        return 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="burst", help="burst, steady or headline")
    p.add_argument("--engines", type=int, default=None, help="override the preset's engine count")
    p.add_argument("--tenants", type=int, default=None, help="override the preset's tenants")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--control-plane", default=os.environ.get("PREWARM_CONTROL_PLANE_URL", ""))
    p.add_argument("--gateway-token", default=os.environ.get("PREWARM_GATEWAY_TOKEN", ""))
    p.add_argument("--operator-token", default=os.environ.get("PREWARM_OPERATOR_TOKEN", ""))
    p.add_argument("--dir", default="var/vcluster", help="agent configs, state and block stores")
    p.add_argument("--time-scale", type=float, default=None, help="sim seconds per wall second")
    p.add_argument("--duration", type=float, default=None, help="wall seconds to run")
    p.add_argument(
        "--loop",
        action="store_true",
        help="replay the workload again when it ends (and its scale-out: joined engines leave "
        "with their KV and join again)",
    )
    p.add_argument(
        "--history-days",
        type=float,
        default=2.0,
        help="days of the trace before the replayed window imported as request history first "
        "(0: none)",
    )
    p.add_argument("--payload-bytes", type=int, default=64 * 1024, help="real bytes per block file")
    p.add_argument("--bind-host", default="127.0.0.1")
    p.add_argument("--advertise-host", default="127.0.0.1", help="how agents reach this process")
    p.add_argument("--base-port", type=int, default=0, help="KV-event ports (0: free ports)")
    p.add_argument("--http-port", type=int, default=0)
    p.add_argument("--agent-listen-host", default="127.0.0.1")
    p.add_argument("--agent-advertise", default="127.0.0.1", help='transfer host; "{node}" allowed')
    p.add_argument("--agent-base-port", type=int, default=0)
    p.add_argument("--spawn-agents", action="store_true", help="start one prewarm-agent per node")
    p.add_argument(
        "--enrolment-tokens",
        default=os.environ.get("PREWARM_ENROLMENT_TOKENS", ""),
        help="comma-separated, one per agent",
    )
    p.add_argument(
        "--credentials",
        help="JSON file from `manage.py virtual_cluster_credentials` "
        "(gateway_token, operator_token, enrolment_tokens)",
    )
    p.add_argument("--wait-for-agents", type=float, default=180.0, help="seconds")
    p.add_argument("--json", dest="json_path", help="write the run's summary here")
    p.add_argument(
        "--served-log",
        help="write one CSV line per served request here (trace seconds, TTFT, engine, cached "
        "and prompt tokens)",
    )


def start_memory_upkeep(environ=os.environ):
    """Heap snapshots when asked (``PREWARM_TRACEMALLOC_DIR``), and the C allocator's free memory
    handed back every ``PREWARM_MALLOC_TRIM_SECONDS`` (60), as the web process does: the serve
    threads' peaks leave glibc's arenas full of freed chunks (in the burst demo one trim took the
    cluster from 588 to 392 MB). Returns the trim thread (None: no glibc, or 0 seconds)."""
    from nodeagent import memtrace, memtrim

    memtrace.start_from_env("cluster", environ)
    return memtrim.start(
        memtrim.every_s_from_env(environ), mmap_threshold=memtrim.mmap_threshold_from_env(environ)
    )


def main_cluster(args) -> int:
    start_memory_upkeep()
    from harness.virtual.agents import spawn_agents, stop_agents
    from harness.virtual.cluster import VirtualCluster
    from harness.virtual.presets import build_preset

    if args.credentials:
        _read_credentials(args)
    if not args.control_plane.startswith(("http://", "https://")):
        raise ValueError("--control-plane must be the control plane's http(s) URL")
    if not args.gateway_token:
        raise ValueError("--gateway-token (or PREWARM_GATEWAY_TOKEN) is required")
    tokens = [t for t in args.enrolment_tokens.split(",") if t]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s vcluster %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per posted batch is noise
    setup, preset = build_preset(
        args.preset, engines=args.engines, tenants=args.tenants, seed=args.seed
    )
    workdir = Path(args.dir)
    vc = VirtualCluster(setup, _options(args, workdir, args.time_scale or preset.time_scale))
    procs = []
    try:
        configs = vc.agent_configs([] if args.spawn_agents else tokens)
        if args.spawn_agents:
            procs = spawn_agents(configs, tokens, workdir)
        (workdir / "ready.json").write_text(
            json.dumps(
                {
                    "agent_configs": [str(c) for c in configs],
                    "http_port": vc.http.port,
                    "engines": [ve.engine_id for ve in vc.engines],
                    "preset": preset.name,
                    "assumptions": setup.assumptions,
                },
                indent=1,
            )
        )
        vc.http.ready = True
        signal.signal(signal.SIGTERM, lambda *_: vc.stop())
        signal.signal(signal.SIGINT, lambda *_: vc.stop())
        print(
            f"virtual cluster: preset {preset.name}, {len(vc.engines)} engines of {vc.model}, "
            f"{len(setup.workload)} requests over {setup.workload.duration_s:.0f} trace seconds "
            f"at {vc.opt.time_scale:g}x",
            flush=True,
        )
        try:
            vc.run(duration_s=args.duration, wait_for_agents_s=args.wait_for_agents)
        except TimeoutError as exc:
            print(f"prewarm-sim: error: {exc} (agent logs: {workdir}/*.log)", file=sys.stderr)
            return 1
        summary = vc.summary()
        print(json.dumps(summary), flush=True)
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(summary, indent=1))
    finally:
        vc.close()
        stop_agents(procs)
    return 0


def _options(args, workdir: Path, time_scale: float):
    """The virtual cluster's options from the ``cluster`` command's arguments."""
    from harness.virtual.options import Options

    return Options(
        control_plane_url=args.control_plane.rstrip("/"),
        gateway_token=args.gateway_token,
        operator_token=args.operator_token,
        workdir=workdir,
        time_scale=time_scale,
        payload_bytes=args.payload_bytes,
        bind_host=args.bind_host,
        advertise_host=args.advertise_host,
        base_port=args.base_port,
        http_port=args.http_port,
        agent_listen_host=args.agent_listen_host,
        agent_advertise=args.agent_advertise,
        agent_base_port=args.agent_base_port,
        loop=args.loop,
        served_log=Path(args.served_log) if args.served_log else None,
        history_days=args.history_days,
    )


def _read_credentials(args) -> None:
    try:
        doc = json.loads(Path(args.credentials).read_text())
        args.gateway_token = args.gateway_token or doc["gateway_token"]
        args.operator_token = args.operator_token or doc["operator_token"]
        args.enrolment_tokens = args.enrolment_tokens or ",".join(doc["enrolment_tokens"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--credentials {args.credentials}: unreadable ({exc})") from None


if __name__ == "__main__":
    sys.exit(main())
