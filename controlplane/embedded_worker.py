"""The embedded default's Celery worker and beat: threads of the web process.

Why threads of the web process, on kombu's in-memory transport, rather than a separate
``celery worker -B`` on a file-system broker:
- the embedded channel layer and residency index are in-memory, per process. A worker in another
  process could not push a job to an agent's socket, nor see or update residency; in the web
  process it shares both, so the embedded mode runs the very code paths production runs;
- ``make demo`` stays one process tree with nothing installed but Python.
What it gives up: tasks queued but not yet run are lost when the process stops. Nothing depends
on them: job states live in the database, the dispatch sweep re-sends approved jobs and the tick
restarts forecast and plan cycles, so a restart resumes where the database says.
Production runs ``celery -A controlplane.celery worker -Q ...`` and ``celery ... beat`` on Redis.
"""

from __future__ import annotations

import logging
import sys
import threading

log = logging.getLogger(__name__)
_started = threading.Event()


def start() -> None:
    """Start one worker (solo pool, every queue) and beat, as daemon threads; idempotent."""
    if _started.is_set():
        return
    _started.set()
    from celery.beat import EmbeddedService

    from controlplane.celery import Queue, app
    from controlplane.realtime import publish

    # Channels' in-memory layer lives on the web server's event loop; the worker thread's
    # publishes must run there (daphne keeps that loop as daphne.server.twisted_loop).
    publish.set_home_loop(getattr(sys.modules.get("daphne.server"), "twisted_loop", None))
    app.loader.import_default_modules()
    worker = app.WorkController(
        hostname="embedded@prewarm",
        pool_cls="solo",
        concurrency=1,
        queues=[q.value for q in Queue],
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
        loglevel="INFO",
    )
    threading.Thread(target=worker.start, name="celery-worker", daemon=True).start()
    from django.conf import settings

    # Beat's schedule state belongs with the rest of the instance's data, not in the checkout.
    beat = EmbeddedService(
        app, thread=True, schedule_filename=str(settings.DATA_DIR / "celerybeat-schedule")
    )
    beat.start()
    log.info("embedded Celery worker and beat started (in-memory broker)")
