"""`make demo`: migrate, create the demo users, serve the control plane on the embedded default.

Everything it starts is a child of this process; Ctrl-C stops them all.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _manage(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], check=True, cwd=ROOT)


def _password(data_dir: Path) -> str:
    path = data_dir / "demo-password"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(9))
        path.chmod(0o600)
    return path.read_text().strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--preset", default="burst", help="virtual-cluster preset (burst or steady)")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    data_dir = Path(os.environ.get("PREWARM_DATA_DIR", ROOT / "var"))
    _manage("migrate", "-v0")
    password = _password(data_dir)
    for user, role in (("admin", "admin"), ("operator", "operator"), ("viewer", "viewer")):
        _manage("ensure_user", user, "--password", password, "--role", role)

    procs: list[subprocess.Popen] = []
    # The embedded Celery worker and beat run as threads of the web process (embedded_worker.py).
    env = {**os.environ, "PREWARM_EMBEDDED_WORKER": "true"}
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", args.host, "-p", str(args.port), "controlplane.asgi:application"],
        cwd=ROOT, env=env))
    url = f"http://{args.host}:{args.port}/"
    print(f"\nPrewarm is running at {url}\n  login: admin / {password}  (also operator, viewer)\n"
          f"  API docs: {url}api/docs/\nCtrl-C stops everything.\n", flush=True)

    def stop(*_):
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while True:
        for p in procs:
            if p.poll() is not None:
                print(f"a demo process exited with code {p.returncode}; stopping", file=sys.stderr)
                stop()
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
