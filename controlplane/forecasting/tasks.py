"""Forecast tasks (``forecast`` queue): take ids, idempotent, a vanished key is logged and skipped.

A cycle fans out: ``forecast_all`` lists the keys to forecast and replaces itself with one
``forecast_batch`` task per ``BATCH_KEYS`` keys, so every forecast worker process shares the
cycle. In the chain ``tick`` builds (``controlplane.replication.tasks``: forecast, then plan),
Celery turns that group into a chord: the plan runs once every batch is in. Forecasting knows
nothing of planning; the horizon arrives as a number.
"""

from __future__ import annotations

import logging

from celery import group, shared_task

from . import services

log = logging.getLogger(__name__)
BATCH_KEYS = 8  # keys per task: small enough to spread a cycle, big enough to amortise a task
DEFAULT_HORIZON_S = 600.0  # without a policy to say otherwise


@shared_task
def forecast_key(key_id: int, horizon_s: float = DEFAULT_HORIZON_S) -> int | None:
    f = services.forecast_key(key_id, horizon_s)
    return f.pk if f else None


@shared_task(ignore_result=False)
def forecast_batch(key_ids: list[int], horizon_s: float = DEFAULT_HORIZON_S) -> int:
    """Forecast these keys; returns how many got a forecast."""
    done = 0
    for key_id in key_ids:
        try:
            done += services.forecast_key(key_id, horizon_s) is not None
        except ValueError as exc:  # a history no model accepts: skip the key, keep going
            log.warning("forecast of key %s refused: %s", key_id, exc)
    return done


@shared_task(bind=True, ignore_result=False)
def forecast_all(self, horizon_s: float = DEFAULT_HORIZON_S) -> int | list[int]:
    """Forecast every recently active key, one ``forecast_batch`` task per BATCH_KEYS keys.

    Returns 0 when there is nothing to forecast; otherwise this task is replaced by the group of
    batches, whose results (forecasts made per batch) go to the next task of its chain.
    """
    ids = list(services.keys_to_forecast())
    if not ids:
        return 0
    batches = [ids[i : i + BATCH_KEYS] for i in range(0, len(ids), BATCH_KEYS)]
    return self.replace(group(forecast_batch.si(b, horizon_s) for b in batches))


@shared_task
def retention() -> dict:
    """Old forecasts go; each key's latest stays (docs/reliability.md)."""
    return services.prune_forecasts()
