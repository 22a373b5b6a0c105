"""A real control plane (daphne) on a loopback port, for tests that cross process boundaries.

On the SQLite default it uses a file under its data directory. Where the environment's
``DATABASE_URL`` names a PostgreSQL server (`make test-services`), it creates a database of its own
there and drops it in ``close()``, as pytest-django does for in-process tests: nothing needs to
exist beforehand and parallel runs never share one. A caller that passes ``DATABASE_URL`` in
``env`` (the benchmarks, several web processes on one database) owns that database itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveControlPlane:
    """daphne serving controlplane.asgi on its own SQLite database (or the env's services)."""

    def __init__(
        self, data_dir: Path, env: dict[str, str] | None = None, daphne: list[str] | None = None
    ):
        # ``daphne``: the command that starts it (a benchmark's profiler wraps it); its arguments
        # follow.
        self.daphne = daphne or [sys.executable, "-m", "daphne"]
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PREWARM_DATA_DIR": str(data_dir),
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "PYTHONUNBUFFERED": "1",
            # Every approved item copied unless a test asks for a holdout: tests count them.
            "PREWARM_HOLDOUT_FRACTION": "0",
            **(env or {}),
        }
        self.database: str | None = None
        url = self.env.get("DATABASE_URL", "")
        if "DATABASE_URL" not in (env or {}) and url.startswith(("postgres://", "postgresql://")):
            self.database = f"prewarm_live_{uuid.uuid4().hex[:10]}"
            pg_admin(url, f'CREATE DATABASE "{self.database}"')
            self.env["DATABASE_URL"] = urlsplit(url)._replace(path=f"/{self.database}").geturl()
        self.proc: subprocess.Popen | None = None
        self.log = open(data_dir / "daphne.log", "ab")  # noqa: SIM115 - closed in close()

    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), *args],
            env=self.env,
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def start(self, timeout: float = 30.0) -> LiveControlPlane:
        self.proc = subprocess.Popen(
            [
                *self.daphne,
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "controlplane.asgi:application",
            ],
            env=self.env,
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"daphne exited: {(self.data_dir / 'daphne.log').read_text()[-2000:]}"
                )
            time.sleep(0.2)
        raise TimeoutError("control plane did not come up")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def close(self) -> None:
        self.stop()
        self.log.close()
        if self.database:
            pg_admin(
                self.env["DATABASE_URL"], f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'
            )
            self.database = None


def pg_admin(url: str, sql: str) -> None:
    """Run one statement on the maintenance database of the server ``url`` names."""
    import psycopg

    admin = (
        urlsplit(url.replace("postgres://", "postgresql://", 1))._replace(path="/postgres").geturl()
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql)


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
