"""The Celery app: queues, routes and the beat schedule of the replication workflow.

Start it with ``celery -A controlplane.celery worker -Q forecast`` (and ``-Q plan``, ``-Q dispatch``,
``-Q default``) and ``celery -A controlplane.celery beat`` on the Redis broker. It is not imported
from ``controlplane/__init__.py``, which stays Django-free for the pure-logic packages.

Embedded default (no ``REDIS_URL``): ``controlplane.embedded_worker`` runs a worker and beat as
threads of the web process on kombu's in-memory transport (the reasons are in that module).

Tasks take ids, are idempotent and log-and-return on a vanished object. The beat schedule is
fixed intervals from settings; the policy-driven cadences (``forecast_every_seconds``,
``plan_every_seconds``) are applied by the ``tick`` task, which reads the active policy every few
seconds, so a policy change takes effect without restarting beat.
"""

from __future__ import annotations

import os
from enum import StrEnum

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")


class Queue(StrEnum):
    """Slow work never shares a queue with latency-sensitive work."""

    DEFAULT = "default"  # tick, sweeps, scoring
    FORECAST = "forecast"  # the forecast tick (array work) and per-key forecasts
    FORECAST_SLOW = "forecast-slow"  # Prophet refits, off the tick path: CPU-heavy
    PLAN = "plan"
    DISPATCH = "dispatch"  # approval -> agent: latency-sensitive


TASK_QUEUES = {
    "controlplane.forecasting.tasks.forecast_all": Queue.FORECAST,
    "controlplane.forecasting.tasks.forecast_key": Queue.FORECAST,
    "controlplane.forecasting.tasks.forecast_batch": Queue.FORECAST,
    "controlplane.forecasting.tasks.fit_slow_model": Queue.FORECAST_SLOW,
    "controlplane.replication.tasks.plan_after_forecasts": Queue.PLAN,
    # A chord's own steps (the forecast cycle's group -> plan) run where the plan runs.
    "celery.accumulate": Queue.PLAN,
    "celery.chord_unlock": Queue.PLAN,
    "controlplane.replication.tasks.plan_cycle": Queue.PLAN,
    "controlplane.replication.tasks.dispatch_job": Queue.DISPATCH,
    # A hot spot seen at ingest plans a few keys and dispatches at once: latency-sensitive.
    "controlplane.replication.tasks.react_to_ingest": Queue.DISPATCH,
    "controlplane.replication.tasks.sweep_jobs": Queue.DISPATCH,
    "controlplane.replication.tasks.evict_expired": Queue.DISPATCH,
    "controlplane.replication.tasks.score_replicas": Queue.DEFAULT,
    "controlplane.replication.tasks.tick": Queue.DEFAULT,
    "controlplane.fleet.tasks.mark_stale": Queue.DEFAULT,
    **{
        f"controlplane.{app}.tasks.retention": Queue.DEFAULT
        for app in ("fleet", "demand", "forecasting", "replication", "audit")
    },
}

app = Celery("prewarm")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = Queue.DEFAULT.value
app.conf.task_routes = {name: {"queue": q.value} for name, q in TASK_QUEUES.items()}
app.conf.task_create_missing_queues = True
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
