"""`make demo`: the whole system on one machine, one command.

Migrates, creates the demo users (the login is printed), starts the control plane on the embedded
default (daphne, with the Celery worker and beat as threads of the web process), then the virtual
cluster (`prewarm-sim cluster`), which starts one real `prewarm-agent` per virtual node and
replays the ServeGen multi-tenant workload in scaled real time. Every process is a child of this
one; Ctrl-C stops them all.

`--preset real` runs two real vLLM engines on CPU instead of the virtual cluster
(`harness/realvllm/demo.py`); `--preset real-heavy` the same with the prefill-heavy
model, where a prefix miss costs many times a hit (`harness/realvllm/presets.py`). What both share is in `launch.py`.

Each run starts from an empty database under `var/demo/<preset>/` so that the scoreboard is about
this run's preset; the demo password is kept in `var/demo/password`. A run holds
`var/demo/<preset>.lock` (and every process it starts inherits it) until its last process has
exited: a second run of the same preset waits for the previous one to finish stopping, or says
plainly that another one is running; so does a run whose port is taken. Two presets run side by
side on different ports (`PRESET=steady PORT=8001 make demo`).

With `DATABASE_URL` and `REDIS_URL` in the environment (and what production settings need:
`SECRET_KEY`, `ALLOWED_HOSTS`, `PREWARM_SECURE=false` on loopback) it runs on those services, with
a Celery worker and beat as processes of their own beside the web process, as a deployment does
(`bench/demo_memory.py --services` measures each one's memory).

A measured run (`experiments/live_vs_sim/`) starts the same processes with `--once`: the
workload is replayed once, every served request is written to `<data>/served.csv`, and the run
stops when the replay ends; `--engines`, `--tenants`, `--seed`, `--policy-fields` (JSON over the demo's
policy, e.g. `{"strategy": "reactive"}`) and `--data-dir` choose what it runs and where.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from django.core.management.base import CommandError

from controlplane.sim.scenarios import link_bytes_per_s
from harness.launch import (
    DEMO_DIR,
    ROOT,
    Children,
    fresh_run,
    password,
    setup_control_plane,
)
from harness.processes import Proc


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    policy = _policy_fields(parser, args)
    sys.path.insert(0, str(ROOT))
    from harness.realvllm.presets import REAL_PRESETS

    if args.preset in REAL_PRESETS:  # realvllm/demo.py
        from harness.realvllm.demo import main as real_demo

        return real_demo(args.host, args.port, REAL_PRESETS[args.preset])
    from harness.virtual.presets import PRESETS

    if args.preset not in PRESETS:
        known = ", ".join([*PRESETS, *REAL_PRESETS])
        parser.error(f"unknown preset {args.preset!r}; known: {known}")
    preset = PRESETS[args.preset]
    data = Path(args.data_dir).resolve() if args.data_dir else DEMO_DIR / args.preset
    if args.data_dir and data.exists() and any(data.iterdir()):
        # var/demo/<preset> is emptied at each start; a folder named here is never.
        parser.error(f"--data-dir {data} is not empty: name a new folder")
    engines = args.engines or preset.engines
    other = next((name for name in PRESETS if name != args.preset), args.preset)
    # Held by this process and inherited by every child (pass_fds below).
    lock, env = fresh_run(
        data,
        args.host,
        args.port,
        beside=f"PRESET={other} PORT={args.port + 1}",
        # The scoreboard prices copies at the virtual cluster's own link speed.
        PREWARM_LINK_BYTES_PER_S=str(link_bytes_per_s(preset.scenario)),
    )
    secret = password()
    print(f"preparing the demo ({preset.name}: {preset.description}) ...", flush=True)
    credentials = data / "credentials.json"
    try:
        setup_control_plane(engines, secret, credentials, policy)
    except CommandError as exc:
        raise SystemExit(f"demo: {exc}") from None
    url = f"http://{args.host}:{args.port}/"

    children = Children()
    children.exit_on_signals()
    children.web(args.host, args.port, env, data, pass_fds=(lock,))
    if env.get("DATABASE_URL") or env.get("REDIS_URL"):
        children.celery(env, data, pass_fds=(lock,))
    children.add(_cluster(args, preset.name, engines, url, data, env, lock))
    print(
        f"\nPrewarm is running at {url}\n"
        f"  login: admin / {secret}  (also operator, viewer)\n"
        f"  preset {preset.name}: {preset.description}; {engines} real agents\n"
        f"  look at: {url} (cache map), {url}plans/, {url}jobs/, {url}scoreboard/\n"
        f"  API docs: {url}api/docs/   logs: {data}/\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )
    children.watch()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--preset",
        default="burst",
        help="virtual-cluster preset (burst or steady), or real / real-heavy: two real vLLM "
        "engines on CPU (tiny or prefill-heavy model)",
    )
    parser.add_argument("--engines", type=int, default=None, help="override the preset's fleet")
    parser.add_argument("--tenants", type=int, default=None, help="override the preset's tenants")
    parser.add_argument("--seed", type=int, default=0, help="the workload's draw")
    parser.add_argument(
        "--policy-fields", default="{}", help="JSON fields over the demo's policy (launch.POLICY)"
    )
    parser.add_argument("--data-dir", default=None, help="default: var/demo/<preset>")
    parser.add_argument(
        "--once",
        action="store_true",
        help="replay the workload once, log every served request, then stop everything",
    )
    return parser


def _policy_fields(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """``--policy-fields`` read, and ``--engines`` and ``--tenants`` checked."""
    try:
        policy = json.loads(args.policy_fields)
    except json.JSONDecodeError as exc:
        parser.error(f"--policy-fields is not JSON: {exc}")
    if not isinstance(policy, dict):
        parser.error("--policy-fields must be a JSON object")
    if (args.engines is not None and args.engines < 1) or (
        args.tenants is not None and args.tenants < 1
    ):
        parser.error("--engines and --tenants must be at least 1")
    return policy


def _cluster(
    args: argparse.Namespace,
    preset: str,
    engines: int,
    url: str,
    data: Path,
    env: dict[str, str],
    lock: int,
) -> Proc:
    """The virtual cluster (``prewarm-sim cluster``), which starts the agents of its nodes."""
    argv = [
        sys.executable,
        "-m",
        "harness.cli",
        "cluster",
        "--preset",
        preset,
        "--control-plane",
        url.rstrip("/"),
        "--dir",
        str(data / "cluster"),
        "--spawn-agents",
        "--credentials",
        str(data / "credentials.json"),
        "--json",
        str(data / "cluster-summary.json"),
        "--engines",
        str(engines),
        "--seed",
        str(args.seed),
        *(["--tenants", str(args.tenants)] if args.tenants else []),
        *(["--served-log", str(data / "served.csv")] if args.once else ["--loop"]),
    ]
    # Its agents are in its group (session): none outlives the demo.
    return Proc("cluster", argv, env, pass_fds=(lock,), session=True)


if __name__ == "__main__":
    sys.exit(main())
