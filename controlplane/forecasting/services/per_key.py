"""One key's forecast, every model fitted inline (Prophet included): the reference the tick is
tested against, and what ``fit_slow_model`` backtests Prophet with."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime

import numpy as np
from django.conf import settings
from django.utils import timezone

from controlplane.core.demand import risk_from_counts
from controlplane.core.forecast.select import forecast_counts
from controlplane.demand.models import WorkloadKey

from ..models import Forecast
from .storage import history

log = logging.getLogger(__name__)
RECENT_BUCKETS = 10  # the window burst risk reads its rate and dispersion from


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
        bucket_s=bucket_s,
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
        bucket_s=bucket_s,
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
