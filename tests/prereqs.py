"""What `make test` needs on the machine, set up where it can be and named where it cannot.

    python -m tests.prereqs services PG_URL REDIS_URL   PostgreSQL and Redis answering; started
                                                       here when installed but stopped; the
                                                       database in PG_URL created if missing
    python -m tests.prereqs chromium                   Debian's chromium for the browser tests
    python -m tests.prereqs data                       the shared traces (../shared/data)
    python -m tests.prereqs podman                     podman, runc and mmdebstrap, able to run
                                                       containers, for the image test

Each missing piece stops the run with one line saying what is missing and how to get it (or how
to leave those tests out on purpose). No Django here: this runs before any settings exist.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from urllib.parse import urlsplit

CHROMIUM = "/usr/bin/chromium"
LOCAL = {"127.0.0.1", "localhost", "::1"}
START_TIMEOUT_S = 30.0


class Missing(Exception):
    """A prerequisite that is not there and cannot be started from here."""


def left_out() -> set[str]:
    """Test markers a developer left out on purpose (PREWARM_TEST_WITHOUT=browser,...)."""
    return {m.strip() for m in os.environ.get("PREWARM_TEST_WITHOUT", "").split(",") if m.strip()}


def _wait(check, timeout: float = START_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return False


def _pg_connect(url: str, dbname: str | None = None):
    import psycopg

    parts = urlsplit(url.replace("postgres://", "postgresql://", 1))
    if dbname is not None:
        parts = parts._replace(path=f"/{dbname}")
    return psycopg.connect(parts.geturl(), autocommit=True, connect_timeout=3)


def _pg_up(url: str) -> bool:
    try:
        _pg_connect(url, "postgres").close()
        return True
    except Exception:
        return False


def ensure_postgres(url: str) -> str:
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 5432
    started = ""
    if not _pg_up(url):
        versions = sorted(glob.glob("/etc/postgresql/*/main"))
        if host not in LOCAL or not versions or not shutil.which("pg_ctlcluster"):
            raise Missing(
                f"PostgreSQL is not answering at {host}:{port} and is not installed here: "
                "apt-get install postgresql (or `make test-embedded`, which needs neither "
                "PostgreSQL nor Redis)"
            )
        version = versions[-1].split("/")[3]
        out = subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            capture_output=True,
            text=True,
        )
        if not _wait(lambda: _pg_up(url), START_TIMEOUT_S if out.returncode == 0 else 1.0):
            raise Missing(
                f"PostgreSQL {version} is installed but does not answer at {host}:{port}: "
                f"{(out.stderr or out.stdout).strip()[-300:] or 'no output'}"
            )
        started = f" (started PostgreSQL {version})"
    name = urlsplit(url).path.lstrip("/")
    if name:
        with _pg_connect(url, "postgres") as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
                started += f" (created database {name})"
    return f"PostgreSQL at {host}{started}"


def _redis_up(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=2).ping())
    except redis.RedisError:
        return False


def ensure_redis(url: str) -> str:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if _redis_up(url):
        return f"Redis at {host}:{port}"
    if host not in LOCAL or not shutil.which("redis-server"):
        raise Missing(
            f"Redis is not answering at {host}:{port} and redis-server is not installed "
            "here: apt-get install redis-server (or `make test-embedded`)"
        )
    out = subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        capture_output=True,
        text=True,
    )
    if not _wait(lambda: _redis_up(url), START_TIMEOUT_S if out.returncode == 0 else 1.0):
        raise Missing(
            f"redis-server is installed but did not start on port {port}: "
            f"{(out.stderr or out.stdout).strip()[-300:] or 'no output'}"
        )
    return f"Redis at {host}:{port} (started redis-server)"


def _left_out(marker: str, what: str) -> str | None:
    """A line saying the ``marker`` tests are left out on purpose, None when they run; refused
    under CI=true."""
    if marker not in left_out():
        return None
    if os.environ.get("CI", "").lower() == "true":
        raise Missing(
            f"PREWARM_TEST_WITHOUT={marker} is a developer's opt-out; under CI=true every test runs"
        )
    return f"{what} left out (PREWARM_TEST_WITHOUT={marker})"


def ensure_chromium() -> str:
    skipped = _left_out("browser", "browser tests")
    if skipped:
        return skipped
    if not os.access(CHROMIUM, os.X_OK):
        raise Missing(
            f"chromium is missing ({CHROMIUM}), the browser tests need it: "
            "apt-get install chromium (or PREWARM_TEST_WITHOUT=browser to leave them out)"
        )
    return f"chromium at {CHROMIUM}"


def ensure_podman() -> str:
    skipped = _left_out("images", "image test")
    if skipped:
        return skipped
    from deploy import images

    why = images.problem()
    if why:
        raise Missing(f"{why} (or PREWARM_TEST_WITHOUT=images to leave the image test out)")
    return "podman runs containers"


def ensure_shared_data() -> str:
    from controlplane.core.traces.paths import shared_data_dir

    path = shared_data_dir()
    if not (path / "vllm-kv-events").is_dir() or not (path / "traces").is_dir():
        raise Missing(
            f"the shared traces and vLLM event captures are not at {path}: clone the repo "
            "with ../shared beside it, or set PREWARM_SHARED_DATA=/path/to/shared/data"
        )
    return f"shared data at {path}"


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["services"] and len(argv) == 3:
            found = [ensure_postgres(argv[1]), ensure_redis(argv[2])]
        elif argv == ["chromium"]:
            found = [ensure_chromium()]
        elif argv == ["podman"]:
            found = [ensure_podman()]
        elif argv == ["data"]:
            found = [ensure_shared_data()]
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Missing as exc:
        print(f"make test: {exc}", file=sys.stderr)
        return 1
    print("make test: " + "; ".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
