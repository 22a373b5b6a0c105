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
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path

from controlplane.core.policy import knobs
from harness.processes import Proc, celery_beat_argv, celery_worker_argv, daphne_argv, wait_healthy
from wire.protocol import TRANSPORT_WARMUP

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
    "max_spec_vram_fraction": knobs.MAX_SPEC_VRAM_FRACTION.high,
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


def fresh_run(
    data: Path, host: str, port: int, beside: str, **extra_env: str
) -> tuple[int, dict[str, str]]:
    """Start a demo run in ``data``: its lock taken (returned: hold it, and pass it to the
    children that must keep it), the port free, the folder emptied (each run's scoreboard is its
    own), and the demo's environment, ``extra_env`` over it, put in this process's and returned
    for its children."""
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    lock = lock_run(data, beside=beside)
    wait_for_port(host, port)
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "PREWARM_DATA_DIR": str(data),
        "PYTHONUNBUFFERED": "1",
        **SETTINGS,
        **extra_env,
    }
    os.environ.update(env)
    return lock, env


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


class Children:
    """The processes a demo (or bench) run started, stopped last-started first: the driver or
    the virtual cluster before the web, so that its last records reach the control plane."""

    def __init__(self, on_stop: Callable[[], None] | None = None):
        self.procs: list[Proc] = []
        self.on_stop = on_stop

    def add(self, proc: Proc) -> Proc:
        """Keep ``proc``, started here unless it already runs. One that leads its own group
        (``session``) and starts children of its own (the virtual cluster's agents) is asked to
        stop alone, and then its whole group is killed, so that none of them outlives the run."""
        self.procs.append(proc if proc.p is not None else proc.start())
        return proc

    def web(self, host: str, port: int, env: dict[str, str], log_dir: Path, pass_fds=()) -> Proc:
        """The control plane on the embedded default: daphne, with the Celery worker and beat
        as threads of the web process (its log ``<log_dir>/web.log``). Returns once
        ``/healthz`` answers."""
        proc = self.add(
            Proc(
                "web",
                daphne_argv(host, port),
                {**env, "PREWARM_EMBEDDED_WORKER": "true"},
                log_dir,
                session=False,
                pass_fds=tuple(pass_fds),
            )
        )
        try:
            wait_healthy(f"http://{host}:{port}/healthz", proc, timeout_s=60.0)
        except (RuntimeError, TimeoutError) as why:
            self.stop()  # a web that never answered must not outlive the run (it holds the lock)
            if isinstance(why, RuntimeError):
                raise SystemExit(f"the control plane exited with code {proc.returncode}") from None
            raise SystemExit("the control plane did not answer /healthz within a minute") from None
        return proc

    def celery(self, env: dict[str, str], data: Path, pass_fds=()) -> None:
        """On production settings (``DATABASE_URL`` / ``REDIS_URL``) the web process runs no
        worker: a Celery worker on every queue and beat, each a process of its own, as a
        deployment runs them (docs/deploy.md)."""
        from controlplane.queues import Queue

        queues = ",".join(q.value for q in Queue)
        for name, argv in (
            ("worker", celery_worker_argv(queues, 1)),
            ("beat", celery_beat_argv(data / "celerybeat-schedule")),
        ):
            self.add(Proc(name, argv, env, data, session=False, pass_fds=tuple(pass_fds)))

    def stop(self, timeout_s: float = 15.0) -> None:
        for p in reversed(self.procs):
            p.stop(timeout_s, leader_first=True)
        self.procs = []
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
                if not p.alive():
                    print(
                        f"a demo process ({p.name}) exited with code {p.returncode}; stopping",
                        file=sys.stderr,
                    )
                    self.stop()
                    sys.exit(0)
            why = check() if check else ""
            if why:
                print(f"{why}; stopping", file=sys.stderr)
                self.stop()
                sys.exit(0)
            time.sleep(0.5)
