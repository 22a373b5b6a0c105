"""Each task names its queue where it is defined (controlplane.queues.task): a call, a chain and
a beat entry are all sent there, with no routing table that could outlive a task."""

from __future__ import annotations

from django.conf import settings

from controlplane.celery import Queue, app
from controlplane.queues import QUEUE_OF

# What must never share a queue: slow work (forecasts, Prophet) and dispatch.
EXPECTED = {
    "controlplane.forecasting.tasks.forecast_all": Queue.FORECAST,
    "controlplane.forecasting.tasks.fit_slow_model": Queue.FORECAST_SLOW,
    "controlplane.replication.tasks.plan_cycle": Queue.PLAN,
    "controlplane.replication.tasks.plan_after_forecasts": Queue.PLAN,
    "controlplane.replication.tasks.dispatch_job": Queue.DISPATCH,
    "controlplane.replication.tasks.react_to_ingest": Queue.DISPATCH,
    "controlplane.replication.tasks.sweep_jobs": Queue.DISPATCH,
    "controlplane.replication.tasks.evict_expired": Queue.DISPATCH,
    "controlplane.replication.tasks.tick": Queue.DEFAULT,
    "controlplane.fleet.tasks.mark_stale": Queue.DEFAULT,
}


def _ours() -> dict:
    app.loader.import_default_modules()
    return {n: t for n, t in app.tasks.items() if n.startswith("controlplane.")}


def test_every_task_names_one_of_the_queues():
    tasks = _ours()
    assert set(EXPECTED) <= set(tasks)
    for name in tasks:
        assert QUEUE_OF.get(name) in {q.value for q in Queue}, f"{name} names no queue"
    assert {n: QUEUE_OF[n] for n in EXPECTED} == {n: q.value for n, q in EXPECTED.items()}


def test_every_beat_entry_is_a_task_that_exists():
    tasks = _ours()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in tasks, entry


def test_a_sent_task_is_routed_to_its_queue():
    """What ``apply_async`` (a call, a chain's step, a beat entry) hands the router."""
    tasks = _ours()
    for name, queue in EXPECTED.items():
        t = tasks[name]
        route = app.amqp.router.route(dict(t._get_exec_options()), t.name)
        assert route["queue"].name == queue.value, name


def test_a_periodic_run_not_started_within_its_period_is_dropped():
    """Beat's entries carry ``expires`` = their period: a worker that reaches a run later than
    that (it was busy) drops it instead of running it, so runs cannot pile up in the broker."""
    from datetime import timedelta

    from celery.contrib.testing.mocks import TaskMessage
    from celery.worker.request import Request

    tasks = _ours()
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        period = float(entry["schedule"])
        sent_at = app.now() - timedelta(seconds=period + 1)  # queued one period and more ago
        expires = sent_at + timedelta(seconds=entry.get("options", {}).get("expires", 1e9))
        late = Request(
            TaskMessage(entry["task"], id=f"late-{name}", expires=expires.isoformat()),
            app=app,
            task=tasks[entry["task"]],
        )
        assert late.revoked(), f"{name}: a run one period late would still run"
        on_time = Request(
            TaskMessage(
                entry["task"],
                id=f"now-{name}",
                expires=(app.now() + timedelta(seconds=period)).isoformat(),
            ),
            app=app,
            task=tasks[entry["task"]],
        )
        assert not on_time.revoked(), name


def test_a_pool_child_over_its_memory_bound_is_replaced(settings):
    """The prefork pool's children are bounded: Celery reads its own setting (KiB) from ours
    (MiB), so a child that passed it after a task is replaced; 0 turns the bound off."""
    assert settings.PREWARM_WORKER_MAX_MEMORY_MB == 1024  # the documented default
    assert app.conf.worker_max_memory_per_child == 1024 * 1024
