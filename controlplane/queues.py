"""Celery queues, and the decorator every task is declared with, so each task names its queue
where it is defined and no route can outlive its task.

    @task(Queue.DISPATCH)
    def sweep_jobs() -> dict: ...
"""

from __future__ import annotations

from enum import StrEnum

from celery import shared_task


class Queue(StrEnum):
    """Slow work never shares a queue with latency-sensitive work."""

    DEFAULT = "default"  # tick, sweeps, scoring, retention
    FORECAST = "forecast"  # the forecast tick: every key's array work in one task
    FORECAST_SLOW = "forecast-slow"  # Prophet refits, off the tick path: CPU-heavy
    PLAN = "plan"
    DISPATCH = "dispatch"  # approval -> agent: latency-sensitive


# Task name -> its queue, filled by ``task`` where each task is defined; ``route`` reads it.
QUEUE_OF: dict[str, str] = {}


def task(queue: Queue, **options):
    """``shared_task`` on ``queue``: its calls, chains and beat entries are sent there (through
    ``route``, Celery's task router: the task attribute ``queue`` is deprecated in Celery 5)."""

    def declare(fn):
        name = options.pop("name", None) or f"{fn.__module__}.{fn.__name__}"
        QUEUE_OF[name] = queue.value
        return shared_task(name=name, **options)(fn)

    return declare


def route(name, args, kwargs, options, task=None, **kw):
    """Celery's ``task_routes`` entry: a task's queue is the one it was declared on."""
    queue = QUEUE_OF.get(name)
    return {"queue": queue} if queue else None
