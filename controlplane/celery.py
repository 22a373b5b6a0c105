"""The Celery app of the replication workflow.

Start it with ``celery -A controlplane.celery worker -Q forecast`` (and ``-Q forecast-slow``,
``-Q plan``, ``-Q dispatch``, ``-Q default``) and ``celery -A controlplane.celery beat`` on the
Redis broker. Each task names its queue where it is defined (``controlplane.queues.task``); the
beat schedule is ``CELERY_BEAT_SCHEDULE`` in the settings. It is not imported
from ``controlplane/__init__.py``, which stays Django-free for the pure-logic packages.

Embedded default (no ``REDIS_URL``): ``controlplane.embedded_worker`` runs a worker and beat as
threads of the web process on kombu's in-memory transport (the reasons are in that module).

No result backend: no task's result is read back (a chain passes a result on in its next
task's message). Tasks take ids, are idempotent and log-and-return on a vanished object. The beat schedule is
fixed intervals from settings; the policy-driven cadences (``forecast_every_s``,
``plan_every_s``) are applied by the ``tick`` task, which reads the active policy every few
seconds, so a policy change takes effect without restarting beat.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from celery import Celery, signals

from controlplane.queues import Queue, route
from nodeagent import memtrace

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
if "celery" in Path(sys.argv[0]).parts:  # a celery command, not a script that imports the app
    memtrace.start_from_env("beat" if "beat" in sys.argv else "worker")

__all__ = ["Queue", "app"]


app = Celery("prewarm")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = Queue.DEFAULT.value
app.conf.task_create_missing_queues = True
app.conf.task_routes = (route,)
app.autodiscover_tasks(
    [
        "controlplane.forecasting",
        "controlplane.replication",
        "controlplane.fleet",
        "controlplane.demand",
        "controlplane.audit",
    ]
)

# Threads that never touched an app (web request threads, the embedded worker) fall back to the
# default app: make that this one, not an unconfigured Celery().
app.set_default()


@signals.worker_init.connect
@signals.worker_process_init.connect  # a prefork pool's child runs the tasks: it trims too
def _start_memtrim(**_) -> None:
    from django.conf import settings

    from nodeagent import memtrim

    memtrim.start(
        settings.PREWARM_MALLOC_TRIM_SECONDS,
        mmap_threshold=settings.PREWARM_MALLOC_MMAP_THRESHOLD_BYTES,
    )
