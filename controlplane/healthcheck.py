"""Container health checks: ``python -m controlplane.healthcheck web|worker|beat``.

- ``web``: ``GET http://127.0.0.1:$PORT/healthz`` answers 200 (``PORT`` defaults to 8000).
- ``worker``: this container's Celery worker answers a ping through the broker.
- ``beat``: beat's schedule file (``--schedule`` path, ``PREWARM_BEAT_SCHEDULE``) was written in
  the last ``PREWARM_BEAT_STALE_SECONDS`` (default 600: beat syncs it every few minutes).

Exit status 0 when healthy, 1 with one line on stderr otherwise.
"""

from __future__ import annotations

import glob
import os
import socket
import sys
import time
import urllib.request

DEFAULT_SCHEDULE = "/var/lib/prewarm/celerybeat-schedule"


def web() -> str | None:
    port = os.environ.get("PORT", "8000")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=4) as resp:
            return None if resp.status == 200 else f"/healthz answered {resp.status}"
    except OSError as exc:
        return f"/healthz unreachable: {exc}"


def worker() -> str | None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from controlplane.celery import app

    name = f"celery@{socket.gethostname()}"
    replies = app.control.ping(destination=[name], timeout=4.0) or []
    return None if any(name in r for r in replies) else f"{name} did not answer a ping"


def beat() -> str | None:
    path = os.environ.get("PREWARM_BEAT_SCHEDULE", DEFAULT_SCHEDULE)
    stale = float(os.environ.get("PREWARM_BEAT_STALE_SECONDS", "600"))
    files = glob.glob(path + "*")  # shelve may add a suffix (.db, .dat)
    if not files:
        return f"no beat schedule at {path}"
    age = time.time() - max(os.path.getmtime(f) for f in files)
    return None if age <= stale else f"beat schedule not written for {age:.0f} s"


CHECKS = {"web": web, "worker": worker, "beat": beat}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in CHECKS:
        print(f"usage: python -m controlplane.healthcheck {'|'.join(CHECKS)}", file=sys.stderr)
        return 2
    problem = CHECKS[args[0]]()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
