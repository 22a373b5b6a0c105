"""Forecast tasks (``forecast`` queue): take ids, idempotent, a vanished key is logged and skipped."""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.replication.models import Policy

from . import services

log = logging.getLogger(__name__)


def _horizon(policy_id: int | None) -> float:
    policy = Policy.objects.filter(pk=policy_id).first() if policy_id else \
        Policy.objects.filter(active=True).first()
    return float(policy.horizon_seconds if policy else 600)


@shared_task
def forecast_key(key_id: int, policy_id: int | None = None) -> int | None:
    f = services.forecast_key(key_id, _horizon(policy_id))
    return f.pk if f else None


@shared_task
def forecast_all(policy_id: int | None = None, then_plan: bool = False) -> int:
    """Forecast every recently active key in this task (one worker, one pass), then optionally
    queue a planning cycle so the plan reads the fresh forecasts."""
    horizon = _horizon(policy_id)
    done = 0
    for key_id in services.keys_to_forecast():
        try:
            done += services.forecast_key(key_id, horizon) is not None
        except ValueError as exc:  # a history no model accepts: skip the key, keep going
            log.warning("forecast of key %s refused: %s", key_id, exc)
    if then_plan and done:
        from controlplane.replication.tasks import plan_cycle

        plan_cycle.delay(policy_id)
    return done


@shared_task
def retention() -> dict:
    """Old forecasts go; each key's latest stays (docs/reliability.md)."""
    return services.prune_forecasts()
