"""Demand series helpers: input validation, bucket aggregation, MASE, interval quantiles.

A demand series is the request count of one workload key per time bucket, oldest first, as a
1-D float array. MASE (Hyndman & Koehler 2006) divides a forecast's mean absolute error by the
in-sample mean absolute error of the one-step naive forecast (lag 1) on the history it was
fitted on. Lag 1 rather than the seasonal lag keeps the scale defined for keys with less than a
day of history and comparable across keys: MASE < 1 beats "tomorrow equals now" as judged on
the key's own history.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

DAY_S = 86_400
WEEK_S = 7 * DAY_S


def as_counts(counts: object, name: str = "counts") -> np.ndarray:
    """`counts` as a 1-D float64 array of finite, non-negative values, or `ValueError`."""
    try:
        arr = np.asarray(counts, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    if (arr < 0).any():
        raise ValueError(f"{name} must be non-negative request counts")
    return arr


def aggregate(counts: np.ndarray, factor: int) -> np.ndarray:
    """Sum groups of `factor` buckets, aligned on the newest bucket (a partial oldest group is
    dropped, so the last aggregated bucket ends where the series ends)."""
    if factor < 1:
        raise ValueError("factor must be >= 1")
    usable = len(counts) - len(counts) % factor
    if usable == 0:
        return np.zeros(0)
    return counts[len(counts) - usable :].reshape(-1, factor).sum(axis=1)


def season_length(bucket_s: int, period_s: int = DAY_S) -> int | None:
    """Buckets per season, or None when the bucket does not divide the period."""
    if bucket_s <= 0 or period_s % bucket_s:
        return None
    return period_s // bucket_s


def mase_scale(history: np.ndarray) -> float:
    """In-sample MAE of the lag-1 naive forecast. A flat history has scale 0; then 1.0 (one
    request per bucket) is used so MASE stays finite and equals the MAE in requests."""
    if len(history) < 2:
        return 1.0
    scale = float(np.mean(np.abs(np.diff(history))))
    return scale if scale > 0 else 1.0


def mase(actual: np.ndarray, forecast: np.ndarray, history: np.ndarray) -> float:
    """Mean absolute scaled error of `forecast` against `actual`, scaled on `history`."""
    actual = np.asarray(actual, dtype=np.float64)
    forecast = np.asarray(forecast, dtype=np.float64)
    if actual.shape != forecast.shape or actual.size == 0:
        raise ValueError("actual and forecast must be non-empty and of equal length")
    return float(np.mean(np.abs(actual - forecast))) / mase_scale(history)


def z_for(interval: float) -> float:
    """Two-sided Normal quantile for a central `interval` (0.8 -> 1.2816)."""
    if not 0 < interval < 1:
        raise ValueError(f"interval must be in (0, 1), got {interval}")
    return NormalDist().inv_cdf(0.5 + interval / 2)


def describe_duration(seconds: float) -> str:
    """'3 h', '2 days', '40 min': for notes shown to operators."""
    if seconds >= 2 * DAY_S:
        return f"{seconds / DAY_S:.3g} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{math.ceil(seconds / 60)} min"
