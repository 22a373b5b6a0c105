"""The forecast tick: every active key at once, as array work over the worker's demand window,
Prophet's forecast read from its fitted state, the forecasts written in one go."""

from __future__ import annotations

import functools
import math
import time
from datetime import UTC, datetime

import numpy as np
from django.conf import settings
from django.utils import timezone

from controlplane.core.forecast.prophet_model import MIN_HISTORY_S as PROPHET_MIN_HISTORY_S
from controlplane.core.forecast.select import FORECASTERS

from .slow_fits import SLOW_MODEL, slow_states
from .storage import keys_to_forecast, store_forecasts
from .window import demand_window


@functools.lru_cache(maxsize=4096)
def _refusals(n: int, bucket_s: int, models: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(r for r in (FORECASTERS[m].refusal(n, bucket_s) for m in models) if r)


def _note(n: int, bucket_s: int, model: str, mase: float, folds: int) -> str:
    """The note ``forecast_key`` would store for this choice."""
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    notes = list(_refusals(n, bucket_s, tuple(m for m in wanted if m in FORECASTERS)))
    if math.isnan(mase):
        return f"baseline only ({n} buckets of history): " + "; ".join(
            [*notes, f"history too short to backtest: {model} unscored"]
        )
    return "; ".join([*notes, f"{model} backtested best (MASE {mase:.3g}, {folds} folds)"])


def forecast_tick(horizon_s: float, now=None) -> dict:
    """Forecast every active key (``keys_to_forecast``) at once and store one ``Forecast`` each.

    The baselines are backtested and chosen per key as ``forecast_key`` does, over the tick's
    window (PREWARM_FORECAST_TICK_DAYS); where the key's Prophet state won its backtest when it was
    fitted and still covers the horizon, its forecast is Prophet's, read from that state. Returns
    the tick's counts and its stage timings (ms)."""
    from controlplane.core.forecast.arrays import (
        ARRAY_MODELS,
        burst_risk_arrays,
        forecast_arrays,
    )

    t0 = time.perf_counter()
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    now_dt = now or timezone.now()
    end = float(now_dt.timestamp() // bucket_s * bucket_s)
    keys = keys_to_forecast(now_dt)
    window, how = demand_window(keys, end, now_dt.timestamp())
    t_read = time.perf_counter()
    lengths = window.lengths()
    live = (lengths > 0) & (window.y.sum(axis=1) > 0)
    ids, y, n = window.key_ids[live], window.y[live], lengths[live]
    horizon = max(1, math.ceil(horizon_s / bucket_s))
    stamp = {"keys": len(keys), "forecast": 0, "window": how}
    if not len(ids):
        return stamp
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    models = [m for m in ARRAY_MODELS if m in wanted] or [ARRAY_MODELS[0]]
    res = forecast_arrays(
        y,
        n,
        bucket_s=bucket_s,
        horizon=horizon,
        models=models,
        backtest_folds=settings.PREWARM_FORECAST_BACKTEST_FOLDS,
    )
    risk = burst_risk_arrays(y, n, bucket_s, horizon_s)
    t_arrays = time.perf_counter()
    slow = slow_states(ids, end) if SLOW_MODEL in wanted else {}
    rows = _forecast_rows(ids, n, res, risk, slow, bucket_s, end, horizon)
    t_rows = time.perf_counter()
    store_forecasts(rows)
    t_write = time.perf_counter()
    stamp.update(
        forecast=len(rows),
        prophet=sum(r["model"] == SLOW_MODEL for r in rows),
        ms={
            "read": round((t_read - t0) * 1e3, 1),
            "arrays": round((t_arrays - t_read) * 1e3, 1),
            "rows": round((t_rows - t_arrays) * 1e3, 1),
            "write": round((t_write - t_rows) * 1e3, 1),
            "total": round((t_write - t0) * 1e3, 1),
        },
    )
    return stamp


def _forecast_rows(
    ids, n, res, risk, slow: dict, bucket_s: int, end: float, horizon: int
) -> list[dict]:
    """One ``Forecast`` row a key: the backtested baseline's, or Prophet's where its state won."""
    from controlplane.core.forecast.series import z_for

    z = z_for(0.8)
    start = datetime.fromtimestamp(end, tz=UTC)
    rows = []
    # Rounded for storage as whole matrices (one C call each, not a Python round per value).
    yhats, lowers, uppers = (np.round(a, 4).tolist() for a in (res.yhat, res.lower, res.upper))
    for i, key_id in enumerate(ids.tolist()):
        model = res.model_name(i)
        yhat, lower, upper = yhats[i], lowers[i], uppers[i]
        mase = float(res.backtest_mase[i])
        scores = res.scores_of(i)
        note = _note(int(n[i]), bucket_s, model, mase, int(res.folds[i, res.model[i]]))
        fit = slow.get(key_id)
        if fit is not None and fit.backtest_mase is not None:
            scores[SLOW_MODEL] = fit.backtest_mase
            if fit.chosen and fit.bucket_s == bucket_s:
                model, mase = SLOW_MODEL, fit.backtest_mase
                yhat, lower, upper = _prophet_bands(fit, bucket_s, end, horizon, z)
                note = f"prophet won its backtest when fitted at {fit.end:%H:%M} (MASE {mase:.3g})"
        elif int(n[i]) * bucket_s >= PROPHET_MIN_HISTORY_S:
            note += "; prophet not fitted yet (slow-model queue)"
        rows.append(
            dict(
                key_id=key_id,
                start=start,
                bucket_s=bucket_s,
                horizon=horizon,
                yhat=yhat,
                lower=lower,
                upper=upper,
                model=model,
                backtest_mase=None if math.isnan(mase) else mase,
                scores={k: (None if not math.isfinite(v) else v) for k, v in scores.items()},
                burst_risk=float(risk[i]),
                note=note[:4000],
            )
        )
    return rows


def _prophet_bands(fit, bucket_s: int, end: float, horizon: int, z: float) -> tuple:
    """Prophet's forecast and band over the horizon, read from the key's fitted state (rounded
    for storage)."""
    from controlplane.core.forecast.prophet_model import interpolate_fit

    p = np.maximum(
        interpolate_fit(fit.values, fit.end.timestamp(), fit.fit_s, bucket_s, end, horizon),
        0.0,
    )
    half = z * fit.sigma
    return tuple(np.round(a, 4).tolist() for a in (p, np.maximum(p - half, 0.0), p + half))
