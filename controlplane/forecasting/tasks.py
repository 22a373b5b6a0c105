"""Forecast tasks: take ids, idempotent, a vanished key is logged and skipped.

A cycle is one task: ``forecast_all`` (``forecast`` queue) forecasts every active key at once
(``tick.forecast_tick``: array work, Prophet read from its fitted state), then sends the
Prophet refits the per-hour budget grants since the previous cycle to the ``forecast-slow``
queue (``fit_slow_model``, staggered over the interval), and returns how many keys got a
forecast. In the chain ``tick`` builds (``controlplane.replication.tasks``: forecast, then plan)
the plan runs after it. Forecasting knows nothing of planning; the horizon arrives as a number.
"""

from __future__ import annotations

import logging
import time

from controlplane.forecasting.services import slow_fits, storage, tick
from controlplane.queues import Queue, task

log = logging.getLogger(__name__)
DEFAULT_HORIZON_S = 600.0  # without a policy to say otherwise


@task(Queue.FORECAST)
def forecast_all(horizon_s: float = DEFAULT_HORIZON_S) -> int:
    """Forecast every recently active key in one array pass; returns how many got a forecast.
    Then queue the Prophet refits due since the previous cycle (off the tick path)."""
    stamp = tick.forecast_tick(horizon_s)
    log.info("forecast tick: %s", stamp)
    schedule_slow_fits(horizon_s)
    return stamp["forecast"]


_last_schedule: dict[str, float] = {}


def schedule_slow_fits(horizon_s: float) -> int:
    """Send the refits the budget grants for the time since this process last sent some, spread
    evenly over that interval (``countdown``), so a worker fits a few keys at a time."""
    now = time.time()
    since = now - _last_schedule.get("at", now - 3600.0)
    _last_schedule["at"] = now
    due = slow_fits.slow_fits_due(since_last_s=since)
    step = min(since, 3600.0) / max(len(due), 1)
    for i, key_id in enumerate(due):
        fit_slow_model.apply_async((key_id, horizon_s), countdown=round(i * step, 1))
    return len(due)


@task(Queue.FORECAST_SLOW)
def fit_slow_model(key_id: int, horizon_s: float = DEFAULT_HORIZON_S) -> int | None:
    """Refit one key's Prophet state (``forecast-slow`` queue)."""
    try:
        f = slow_fits.fit_slow_model(key_id, horizon_s)
    except ValueError as exc:  # a history no model accepts: skip the key
        log.warning("slow fit of key %s refused: %s", key_id, exc)
        return None
    return f.pk if f else None


@task(Queue.DEFAULT)
def retention() -> dict:
    """Old forecasts go; each key's latest stays (docs/reliability.md)."""
    return storage.prune_forecasts()
