"""Forecast a workload key from its demand buckets and store the result (worker side).

Calls the pure forecasters (``controlplane.core.forecast``): every model that accepts the key's
history is backtested and the best kept; a key with too little history gets the baseline the
forecasters fall back to, and the stored ``note`` says so. Burst risk is the chance that the
next horizon brings more than ``core.demand.BURST_FACTOR`` x the recent rate, from the recent
rate and the dispersion of recent bucket counts: ``controlplane.core.demand.risk_from_counts``, the demand
model the simulator's predictive policy shares.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from controlplane.core.demand import risk_from_counts
from controlplane.core.forecast import forecast_counts
from controlplane.demand.models import DemandBucket, WorkloadKey

from .models import Forecast

log = logging.getLogger(__name__)
__all__ = ["forecast_key", "history", "keys_to_forecast", "risk_of"]
RECENT_BUCKETS = 10  # the window burst risk reads its rate and dispersion from


def history(key_id: int, bucket_s: int, end: float, days: float) -> np.ndarray:
    """Requests per bucket, oldest first, from the key's first bucket (at most ``days`` back)
    to ``end``; missing buckets are zeros."""
    since = datetime.fromtimestamp(end - days * 86400, tz=UTC)
    rows = list(
        DemandBucket.objects.filter(
            key_id=key_id,
            seconds=bucket_s,
            start__gte=since,
            start__lt=datetime.fromtimestamp(end, tz=UTC),
        ).values_list("start", "requests")
    )
    if not rows:
        return np.zeros(0)
    first = min(r[0] for r in rows).timestamp()
    n = int(round((end - first) / bucket_s))
    out = np.zeros(n)
    for start, count in rows:
        out[int((start.timestamp() - first) // bucket_s)] += count
    return out


def risk_of(counts: np.ndarray, bucket_s: int, horizon_s: float) -> float:
    return risk_from_counts(counts[-RECENT_BUCKETS:], bucket_s, horizon_s)


def forecast_key(key_id: int, horizon_s: float, now=None) -> Forecast | None:
    """Forecast one key's next ``horizon_s`` and store it; None if the key vanished or has no
    demand yet."""
    if not WorkloadKey.objects.filter(pk=key_id).exists():
        log.info("forecast: workload key %s vanished", key_id)
        return None
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    now = (now or timezone.now()).timestamp()
    # The current bucket is still filling: history ends at its start.
    end = float(now // bucket_s * bucket_s)
    counts = history(key_id, bucket_s, end, settings.PREWARM_FORECAST_HISTORY_DAYS)
    if counts.sum() <= 0:
        return None
    horizon = max(1, math.ceil(horizon_s / bucket_s))
    res = forecast_counts(
        counts,
        start=end,
        bucket_seconds=bucket_s,
        horizon=horizon,
        models=settings.PREWARM_FORECAST_MODELS or None,
        backtest_folds=settings.PREWARM_FORECAST_BACKTEST_FOLDS,
    )
    note = res.note
    if res.backtest_mase is None:
        note = f"baseline only ({len(counts)} buckets of history): " + note
    f = Forecast.objects.create(
        key_id=key_id,
        start=datetime.fromtimestamp(res.start, tz=UTC),
        bucket_seconds=bucket_s,
        horizon=horizon,
        yhat=[round(float(v), 4) for v in res.yhat],
        lower=[round(float(v), 4) for v in res.lower],
        upper=[round(float(v), 4) for v in res.upper],
        model=res.model,
        backtest_mase=res.backtest_mase,
        scores={k: (None if not math.isfinite(v) else v) for k, v in res.scores.items()},
        burst_risk=risk_of(counts, bucket_s, horizon_s),
        note=note[:4000],
    )
    return f  # no page shows forecasts live (the forecasts page reads the table on load)


def keys_to_forecast(now=None) -> list[int]:
    """Keys with demand in the recent history window."""
    now = now or timezone.now()
    since = now - timedelta(days=settings.PREWARM_FORECAST_HISTORY_DAYS)
    return list(WorkloadKey.objects.filter(last_seen__gte=since).values_list("pk", flat=True))


@transaction.atomic
def prune_forecasts(now=None) -> dict:
    """Forecasts older than the keep window go, except each key's latest."""
    now = now or timezone.now()
    latest = (
        Forecast.objects.filter(key_id=OuterRef("key_id"))
        .order_by("-generated_at", "-id")
        .values("id")[:1]
    )
    old = Forecast.objects.filter(
        generated_at__lt=now - timedelta(hours=settings.PREWARM_FORECAST_KEEP_HOURS)
    )
    deleted, _ = old.exclude(id=Subquery(latest)).delete()
    return {"forecasts_deleted": deleted}
