"""Starting and stopping the processes the demo, the tests and the benchmarks run: one child
with its own log (``Proc``), a free loopback port, waiting for a condition, and the PostgreSQL
database a run uses (created when missing, said in one line when the server does not answer).

The demo's run of several children (``launch.Children``), the real control plane of the tests
and benchmarks (``live.LiveControlPlane``), the end-to-end cluster and the LMCache fixtures all
start their children through ``Proc``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """``predicate()``'s first truthy value, polled until ``timeout`` (then AssertionError)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def manage(env: dict[str, str], *args: str) -> str:
    """``manage.py ARGS`` in ``env``; its stdout, or RuntimeError with the end of its stderr."""
    out = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"manage.py {args[0]} failed: {out.stderr[-2000:]}")
    return out.stdout


class Proc:
    """One child process in its own session, with its own log; restartable, killable by signal
    (a worker's pool children die with it)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_dir: Path,
        stop_timeout_s: float = 15.0,
    ):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_dir / f"{name}.log"
        self.stop_timeout_s = stop_timeout_s
        self.p: subprocess.Popen | None = None

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            self.p = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process group."""
        if self.p is not None and self.alive():
            os.killpg(self.p.pid, sig)
            self.p.wait(self.stop_timeout_s)

    def stop(self) -> None:
        if self.p is not None and self.alive():
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


class DatabaseUnavailable(RuntimeError):
    """The PostgreSQL server a run needs does not answer (the message is one line)."""


def _admin_url(url: str) -> str:
    url = url.replace("postgres://", "postgresql://", 1)
    return urlsplit(url)._replace(path="/postgres").geturl()


def pg_admin(url: str, sql: str) -> None:
    """Run one statement on the maintenance database of the server ``url`` names."""
    import psycopg

    with psycopg.connect(_admin_url(url), autocommit=True) as conn:
        conn.execute(sql)


def ensure_database(url: str) -> bool:
    """Create the database ``url`` names when it does not exist; True when it was created."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    try:
        with psycopg.connect(_admin_url(url), autocommit=True, connect_timeout=5) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                return False
            conn.execute(f'CREATE DATABASE "{name}"')
            return True
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or ["no answer"])[0]
        host = urlsplit(url).hostname
        raise DatabaseUnavailable(f"PostgreSQL at {host} does not answer: {first}") from None
