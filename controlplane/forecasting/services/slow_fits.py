"""Prophet off the tick path: which keys are due a refit under the per-hour budget, the refit
itself (stored as the fitted model's expected counts), and the fresh states a tick reads."""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from controlplane.core.forecast.prophet_model import MIN_HISTORY_S as PROPHET_MIN_HISTORY_S
from controlplane.core.forecast.select import FORECASTERS, forecast_counts
from controlplane.demand.models import DemandBucket, WorkloadKey

from ..models import FittedModel
from .storage import history

log = logging.getLogger(__name__)
SLOW_MODEL = "prophet"
#: Fit buckets of Prophet's expected counts stored per refit: a day and a bit, so a tick may
#: read them until the next refit of the key comes round.
SLOW_FIT_SPAN = 26


def slow_states(key_ids: np.ndarray, end: float) -> dict[int, FittedModel]:
    """Fresh fitted Prophet states (their stored span still covers ``end``) by key."""
    oldest = datetime.fromtimestamp(end - (SLOW_FIT_SPAN - 2) * 3600, tz=UTC)
    return {
        f.key_id: f
        for f in FittedModel.objects.filter(model=SLOW_MODEL, end__gte=oldest).only(
            "key_id",
            "end",
            "bucket_s",
            "fit_s",
            "values",
            "sigma",
            "backtest_mase",
            "chosen",
        )
        if f.key_id in set(key_ids.tolist())
    }


def slow_fits_due(now=None, since_last_s: float | None = None) -> list[int]:
    """Keys whose Prophet state is due for a refit, as many as the per-hour budget grants for
    ``since_last_s`` seconds (the time since the previous call): never-fitted keys with 2 days
    of history first, then the oldest fits."""
    budget = settings.PREWARM_FORECAST_SLOW_FITS_PER_HOUR
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    if budget <= 0 or SLOW_MODEL not in wanted:
        return []
    now = now or timezone.now()
    n = math.ceil(budget * min(since_last_s or 3600.0, 3600.0) / 3600.0)
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    # A key's first bucket at least PROPHET_MIN_HISTORY_S ago: it has the history Prophet takes.
    # An EXISTS per key (the (key, start, seconds) index), not a scan of every old bucket.
    cutoff = now - timedelta(seconds=PROPHET_MIN_HISTORY_S)
    old_enough = DemandBucket.objects.filter(
        key_id=OuterRef("pk"), seconds=bucket_s, start__lte=cutoff
    )
    active = WorkloadKey.objects.filter(
        Exists(old_enough),
        last_seen__gte=now - timedelta(days=settings.PREWARM_FORECAST_HISTORY_DAYS),
    )
    fitted = dict(FittedModel.objects.filter(model=SLOW_MODEL).values_list("key_id", "fitted_at"))
    ids = list(active.values_list("pk", flat=True))
    never = [k for k in ids if k not in fitted]
    stale = sorted((k for k in ids if k in fitted), key=fitted.__getitem__)
    return (never + stale)[:n]


def fit_slow_model(key_id: int, horizon_s: float, now=None) -> FittedModel | None:
    """Refit Prophet on one key's whole history (PREWARM_FORECAST_HISTORY_DAYS), backtest it
    against the baselines as ``forecast_key`` does, and store its expected counts for the next
    ``SLOW_FIT_SPAN`` hours; None when the key vanished or has too little history."""
    if not WorkloadKey.objects.filter(pk=key_id).exists():
        log.info("slow fit: workload key %s vanished", key_id)
        return None
    t0 = time.perf_counter()
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    now = (now or timezone.now()).timestamp()
    end = float(now // bucket_s * bucket_s)
    counts = history(key_id, bucket_s, end, settings.PREWARM_FORECAST_HISTORY_DAYS)
    prophet = FORECASTERS[SLOW_MODEL]
    if counts.sum() <= 0 or prophet.refusal(len(counts), bucket_s):
        return None
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    res = forecast_counts(
        counts,
        start=end,
        bucket_s=bucket_s,
        horizon=max(1, math.ceil(horizon_s / bucket_s)),
        models=wanted,
        backtest_folds=settings.PREWARM_FORECAST_BACKTEST_FOLDS,
    )
    chosen = res.model == SLOW_MODEL
    fitted = res.fitted if chosen else None
    values: list[float] = []
    sigma = 0.0
    fit_s = bucket_s
    if fitted is not None:
        values = [round(float(v), 4) for v in fitted.fit_values(SLOW_FIT_SPAN)]  # type: ignore[attr-defined]
        sigma, fit_s = float(fitted.sigma), int(fitted.fit_s)  # type: ignore[attr-defined]
    obj, _ = FittedModel.objects.update_or_create(
        key_id=key_id,
        model=SLOW_MODEL,
        defaults=dict(
            fitted_at=timezone.now(),
            end=datetime.fromtimestamp(end, tz=UTC),
            bucket_s=bucket_s,
            fit_s=fit_s,
            values=values,
            sigma=sigma,
            backtest_mase=res.scores.get(SLOW_MODEL),
            chosen=chosen,
            fit_ms=round((time.perf_counter() - t0) * 1e3, 1),
            note=res.note[:4000],
        ),
    )
    return obj
