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


def task(queue: Queue, **options):
    """``shared_task`` on ``queue``: its calls, chains and beat entries are sent there."""
    return shared_task(queue=queue.value, **options)
