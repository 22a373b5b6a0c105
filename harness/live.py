"""A real control plane (daphne) on a loopback port, for tests that cross process boundaries.

On the SQLite default it uses a file under its data directory. Where the environment's
``DATABASE_URL`` names a PostgreSQL server (`make test-services`), it creates a database of its own
there and drops it in ``close()``, as pytest-django does for in-process tests: nothing needs to
exist beforehand and parallel runs never share one. A caller that passes ``DATABASE_URL`` in
``env`` (the benchmarks, several web processes on one database) owns that database itself.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from harness.processes import Proc, daphne_argv, free_port, manage, pg_admin, wait_healthy


class LiveControlPlane:
    """daphne serving controlplane.asgi on its own SQLite database (or the env's services)."""

    def __init__(
        self, data_dir: Path, env: dict[str, str] | None = None, daphne: list[str] | None = None
    ):
        # ``daphne``: the command that starts it (a benchmark's profiler wraps it); its arguments
        # follow.
        self.daphne = daphne
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
        self.proc: Proc | None = None

    def manage(self, *args: str) -> str:
        return manage(self.env, *args).strip()

    def start(self, timeout: float = 30.0) -> LiveControlPlane:
        argv = daphne_argv("127.0.0.1", self.port, prefix=self.daphne)
        self.proc = Proc("daphne", argv, self.env, self.data_dir, stop_timeout_s=10.0).start()
        try:
            wait_healthy(f"{self.url}/healthz", self.proc, timeout, interval=0.2)
        except TimeoutError:
            raise TimeoutError("control plane did not come up") from None
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self.database:
            pg_admin(
                self.env["DATABASE_URL"], f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'
            )
            self.database = None
