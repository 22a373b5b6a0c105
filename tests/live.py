"""A real control plane (daphne) on a loopback port, for tests that cross process boundaries."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveControlPlane:
    """daphne serving controlplane.asgi on its own SQLite database (or the env's services)."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PREWARM_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = open(data_dir / "daphne.log", "ab")  # noqa: SIM115 - closed in close()

    def manage(self, *args: str) -> str:
        out = subprocess.run([sys.executable, str(REPO / "manage.py"), *args], env=self.env, cwd=REPO,
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def start(self, timeout: float = 30.0) -> LiveControlPlane:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "controlplane.asgi:application"],
            env=self.env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited: {(self.data_dir / 'daphne.log').read_text()[-2000:]}")
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


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
