"""`make demo`: the whole system on one machine, one command.

Migrates, creates the demo users (the login is printed), starts the control plane on the embedded
default (daphne, with the Celery worker and beat as threads of the web process), then the virtual
cluster (`prewarm-sim cluster`), which starts one real `prewarm-agent` per virtual node and
replays the ServeGen multi-tenant workload in scaled real time. Every process is a child of this
one; Ctrl-C stops them all.

`--preset real` runs two real vLLM engines on CPU instead of the virtual cluster
(`controlplane/realvllm/demo.py`).

Each run starts from an empty database under `var/demo/<preset>/` so that the scoreboard is about
this run's preset; the demo password is kept in `var/demo/password`. A run holds
`var/demo/<preset>.lock` (and every process it starts inherits it) until its last process has
exited: a second run of the same preset waits for the previous one to finish stopping, or says
plainly that another one is running; so does a run whose port is taken. Two presets run side by
side on different ports (`PRESET=steady PORT=8001 make demo`).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import httpx

from controlplane.sim.scenarios import link_bytes_per_s

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / "var" / "demo"

# The policy each preset runs: auto approval, cadences fit for a time-compressed trace (the
# virtual cluster replays 10 trace seconds per wall second, so a 60 s TTL is 10 trace minutes),
# the largest speculative VRAM share the API allows, a byte budget sized for 70B prefixes.
# Copies are warm-ups (prefill-only requests to the target engine's OpenAI endpoint), so every
# replica the demo shows is one its engine confirmed with its own KV events.
POLICY = {
    "mode": "auto",
    "default_transport": "warmup",
    "forecast_every_seconds": 10,
    "plan_every_seconds": 10,
    "horizon_seconds": 60,
    "replica_ttl_seconds": 60,
    "min_confidence": 0.3,
    "max_spec_vram_fraction": 0.5,
    "interval_seconds": 60,
    "max_bytes_per_interval": 2 * 1024**4,
}
# Control-plane settings for the demo: demand in 5-second buckets (30 trace seconds), scores
# every 10 seconds, agents' nodes marked stale after 15 seconds.
SETTINGS = {
    "PREWARM_DEMAND_BUCKET_SECONDS": "5",
    "PREWARM_SCORE_SECONDS": "10",
    # A demo lasts minutes, not days: a verdict after 5 scored replicas, said on the page.
    "PREWARM_SCOREBOARD_MIN_REPLICAS": "5",
    "PREWARM_NODE_STALE_SECONDS": "15",
    "PREWARM_WARMING_LEAD_SECONDS": "30",
}


# How long a new run waits for a previous one to let go of the folder or the port: its Ctrl-C
# stops the cluster's agents, then the web process, each given 15 s to exit.
WAIT_FOR_PREVIOUS_S = 45.0


def _lock(
    data: Path, timeout_s: float = WAIT_FOR_PREVIOUS_S, beside: str = "PRESET=steady PORT=8001"
) -> int:
    """Hold ``<data>.lock`` for this run; wait while a previous run still holds it."""
    fd = os.open(str(data) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    deadline, told = time.monotonic() + timeout_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise SystemExit(
                    f"another demo of this preset is running ({holder}; folder {data}): "
                    f"stop it first, or run another preset beside it ({beside} make demo)"
                ) from None
            if not told:
                print(
                    f"waiting for the previous demo run to stop (it holds {data}) ...", flush=True
                )
                told = True
            time.sleep(0.5)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        return fd


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as daphne binds: TIME_WAIT is no obstacle
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _wait_for_port(host: str, port: int, timeout_s: float = WAIT_FOR_PREVIOUS_S) -> None:
    deadline, told = time.monotonic() + timeout_s, False
    while not _port_free(host, port):
        if time.monotonic() >= deadline:
            raise SystemExit(
                f"port {port} on {host} is in use (another demo or server?): stop it, "
                f"or choose another port (PORT={port + 1} make demo)"
            )
        if not told:
            print(f"waiting for port {port} on {host} to be free ...", flush=True)
            told = True
        time.sleep(0.5)


def _password() -> str:
    path = DEMO_DIR / "password"
    if not path.exists():
        DEMO_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(9))
        path.chmod(0o600)
    return path.read_text().strip()


def _setup(engines: int, password: str, credentials: Path) -> None:
    """Migrate, users, the policy and the virtual cluster's tokens, in this process."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    for user, role in (("admin", "admin"), ("operator", "operator"), ("viewer", "viewer")):
        call_command(
            "ensure_user", user, f"--password={password}", "--role", role, stdout=StringIO()
        )  # "=": a password may start with "-"
    call_command("ensure_policy", "demo", "--fields", json.dumps(POLICY), stdout=StringIO())
    call_command(
        "virtual_cluster_credentials",
        "--agents",
        str(engines),
        "--out",
        str(credentials),
        stdout=StringIO(),
    )


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the control plane exited with code {proc.returncode}")
        try:
            if httpx.get(url + "healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("the control plane did not answer /healthz within a minute")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--preset",
        default="burst",
        help="virtual-cluster preset (burst or steady), or real: two real vLLM engines on CPU",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.preset == "real":  # controlplane/realvllm/demo.py
        from controlplane.realvllm.demo import main as real_demo

        return real_demo(args.host, args.port)
    from controlplane.sim.virtual.presets import PRESETS

    if args.preset not in PRESETS:
        parser.error(f"unknown preset {args.preset!r}; known: {', '.join(PRESETS)}")
    preset = PRESETS[args.preset]
    data = DEMO_DIR / args.preset
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    other = next((name for name in PRESETS if name != args.preset), args.preset)
    # Held by this process and inherited by every child (pass_fds below).
    lock = _lock(data, beside=f"PRESET={other} PORT={args.port + 1}")
    _wait_for_port(args.host, args.port)
    if data.exists():
        shutil.rmtree(data)  # each run starts empty: the scoreboard is this run's
    data.mkdir(parents=True)
    password = _password()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "PREWARM_DATA_DIR": str(data),
        "PYTHONUNBUFFERED": "1",
        **SETTINGS,
        # The scoreboard prices copies at the virtual cluster's own link speed.
        "PREWARM_LINK_BYTES_PER_S": str(link_bytes_per_s(preset.scenario)),
    }
    os.environ.update(env)
    print(f"preparing the demo ({preset.name}: {preset.description}) ...", flush=True)
    credentials = data / "credentials.json"
    _setup(preset.engines, password, credentials)
    url = f"http://{args.host}:{args.port}/"

    procs: list[subprocess.Popen] = []

    def stop(*_: object) -> None:
        # The virtual cluster (and its agents) first, so its last records reach the web.
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    web_log = open(data / "web.log", "ab")  # noqa: SIM115 - the child keeps it
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                args.host,
                "-p",
                str(args.port),
                "controlplane.asgi:application",
            ],
            cwd=ROOT,
            env={**env, "PREWARM_EMBEDDED_WORKER": "true"},
            stdout=web_log,
            stderr=subprocess.STDOUT,
            pass_fds=(lock,),
        )
    )
    _wait_healthy(url, procs[0])
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controlplane.sim.cli",
                "cluster",
                "--preset",
                preset.name,
                "--control-plane",
                url.rstrip("/"),
                "--dir",
                str(data / "cluster"),
                "--spawn-agents",
                "--loop",
                "--credentials",
                str(credentials),
                "--json",
                str(data / "cluster-summary.json"),
            ],
            cwd=ROOT,
            env=env,
            pass_fds=(lock,),
        )
    )
    print(
        f"\nPrewarm is running at {url}\n"
        f"  login: admin / {password}  (also operator, viewer)\n"
        f"  preset {preset.name}: {preset.description}; {preset.engines} real agents\n"
        f"  look at: {url} (cache map), {url}plans/, {url}jobs/, {url}scoreboard/\n"
        f"  API docs: {url}api/docs/   logs: {data}/\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )
    while True:
        for p in procs:
            if p.poll() is not None:
                print(f"a demo process exited with code {p.returncode}; stopping", file=sys.stderr)
                stop()
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
