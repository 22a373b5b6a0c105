"""What both demo presets share: the run's folder and lock, the port, the demo password, the
control plane's set-up (migrations, users, policy, credentials) and its health.

A run holds ``var/demo/<preset>.lock`` (and every process it starts inherits it) until its last
process has exited: a second run of the same preset waits for the previous one to finish
stopping, or says plainly that another one is running; so does a run whose port is taken.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import httpx

from wire.protocol import SOCKET_MESSAGE_MAX_BYTES, TRANSPORT_WARMUP

ROOT = Path(__file__).resolve().parents[1]
DEMO_DIR = ROOT / "var" / "demo"

# The policy each preset runs: auto approval, cadences fit for a time-compressed trace (the
# virtual cluster replays 10 trace seconds per wall second, so a 60 s TTL is 10 trace minutes),
# the largest speculative VRAM share the API allows, a byte budget sized for 70B prefixes.
# Copies are warm-ups (prefill-only requests to the target engine's OpenAI endpoint), so every
# replica the demo shows is one its engine confirmed with its own KV events. A demo lasts
# minutes and speculates on a handful of prefixes, so half of them are held out (the deployment
# default is 15%): the treated-vs-held-out comparison then has prefixes on both arms within
# minutes.
POLICY = {
    "mode": "auto",
    "default_transport": TRANSPORT_WARMUP,
    "forecast_every_seconds": 10,
    "plan_every_seconds": 10,
    "horizon_seconds": 60,
    "replica_ttl_seconds": 60,
    "min_confidence": 0.3,
    "max_spec_vram_fraction": 0.5,
    "interval_seconds": 60,
    "max_bytes_per_interval": 2 * 1024**4,
    "holdout_fraction": 0.5,
}
# Control-plane settings for the demo: demand in 5-second buckets (30 trace seconds), scores
# every 10 seconds, agents' nodes marked stale after 15 seconds.
SETTINGS = {
    "PREWARM_DEMAND_BUCKET_SECONDS": "5",
    "PREWARM_SCORE_SECONDS": "10",
    # A demo lasts minutes, not days: a verdict after 5 scored replicas, said on the page.
    "PREWARM_SCOREBOARD_MIN_REPLICAS": "5",
    # ... and the holdout's measured uplift once 4 assignments on each arm carry TTFT.
    "PREWARM_HOLDOUT_MIN_ASSIGNMENTS": "4",
    "PREWARM_NODE_STALE_SECONDS": "15",
    "PREWARM_WARMING_LEAD_SECONDS": "30",
}


# How long a new run waits for a previous one to let go of the folder or the port: its Ctrl-C
# stops the cluster's agents, then the web process, each given 15 s to exit.
WAIT_FOR_PREVIOUS_S = 45.0


def lock_run(
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


def port_free(host: str, port: int) -> bool:
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


def wait_for_port(host: str, port: int, timeout_s: float = WAIT_FOR_PREVIOUS_S) -> None:
    deadline, told = time.monotonic() + timeout_s, False
    while not port_free(host, port):
        if time.monotonic() >= deadline:
            raise SystemExit(
                f"port {port} on {host} is in use (another demo or server?): stop it, "
                f"or choose another port (PORT={port + 1} make demo)"
            )
        if not told:
            print(f"waiting for port {port} on {host} to be free ...", flush=True)
            told = True
        time.sleep(0.5)


def password() -> str:
    path = DEMO_DIR / "password"
    if not path.exists():
        DEMO_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(9))
        path.chmod(0o600)
    return path.read_text().strip()


def setup_control_plane(
    engines: int, password: str, credentials: Path, policy: dict | None = None
) -> None:
    """Migrate, users, the policy (``POLICY``, with ``policy``'s fields over it) and the
    virtual cluster's tokens, in this process."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    for user, role in (("admin", "admin"), ("operator", "operator"), ("viewer", "viewer")):
        call_command(
            "ensure_user", user, f"--password={password}", "--role", role, stdout=StringIO()
        )  # "=": a password may start with "-"
    fields = json.dumps({**POLICY, **(policy or {})})
    call_command("ensure_policy", "demo", "--fields", fields, stdout=StringIO())
    call_command(
        "virtual_cluster_credentials",
        "--agents",
        str(engines),
        "--out",
        str(credentials),
        stdout=StringIO(),
    )


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
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


class Children:
    """The processes a demo (or bench) run started, stopped last-started first: the driver or
    the virtual cluster before the web, so that its last records reach the control plane."""

    def __init__(self, on_stop: Callable[[], None] | None = None):
        self.procs: list[subprocess.Popen] = []
        self.groups: set[int] = set()  # children that lead their own process group
        self.on_stop = on_stop

    def add(self, proc: subprocess.Popen, group: bool = False) -> subprocess.Popen:
        """``group``: the child was started with ``start_new_session=True`` and starts
        children of its own (the virtual cluster's agents): if it does not stop in time, its
        whole group is killed, so that none of them outlives the run."""
        self.procs.append(proc)
        if group:
            self.groups.add(proc.pid)
        return proc

    def web(
        self, host: str, port: int, env: dict[str, str], log_path: Path, pass_fds=()
    ) -> subprocess.Popen:
        """The control plane on the embedded default: daphne, with the Celery worker and beat
        as threads of the web process. Returns once ``/healthz`` answers."""
        with open(log_path, "ab") as log:
            proc = self.add(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "daphne",
                        "-b",
                        host,
                        "-p",
                        str(port),
                        "--websocket-max-message-size",
                        str(SOCKET_MESSAGE_MAX_BYTES),
                        "controlplane.asgi:application",
                    ],
                    cwd=ROOT,
                    env={**env, "PREWARM_EMBEDDED_WORKER": "true"},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=tuple(pass_fds),
                )
            )
        wait_healthy(f"http://{host}:{port}/", proc)
        return proc

    def stop(self, timeout_s: float = 15.0) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.pid in self.groups:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # what it started and did not stop
                except ProcessLookupError:
                    pass
        self.procs, self.groups = [], set()
        if self.on_stop:
            self.on_stop()

    def exit_on_signals(self) -> None:
        def stop(*_: object) -> None:
            self.stop()
            sys.exit(0)

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)

    def watch(self, check: Callable[[], str] | None = None) -> None:
        """Until one child exits (or ``check`` names a reason), then stop them all."""
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    print(
                        f"a demo process exited with code {p.returncode}; stopping", file=sys.stderr
                    )
                    self.stop()
                    sys.exit(0)
            why = check() if check else ""
            if why:
                print(f"{why}; stopping", file=sys.stderr)
                self.stop()
                sys.exit(0)
            time.sleep(0.5)
