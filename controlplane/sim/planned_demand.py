"""The demand signals of the planned policies (``planned.py``) that need no policy state: the
oracle's true arrivals over the horizon and the day-scale forecasts of the keys' histories."""

from __future__ import annotations

import math

import numpy as np

from controlplane.core.forecast.select import forecast_counts
from controlplane.core.policy.types import Demand

DAY_BUCKETS = 144  # 10-minute buckets in a day
DAY_MODELS = ("last_value", "ewma", "seasonal_naive", "seasonal_blend")
MAX_CANDIDATES = 256


def day_forecasts(wl, use_prophet: bool) -> tuple[dict[str, np.ndarray], dict[str, float | None]]:
    """Per key with two days of history: the day-scale forecast over the run (best model by
    backtest; Prophet among them when ``use_prophet``) and its backtest MASE."""
    day: dict[str, np.ndarray] = {}
    day_mase: dict[str, float | None] = {}
    models = None if use_prophet else DAY_MODELS
    horizon = int(math.ceil(wl.duration_s / wl.history_bucket_s)) + 1
    for key, hist in wl.history.items():
        if len(hist) < 2 * DAY_BUCKETS or hist.sum() <= 0:
            continue
        try:
            res = forecast_counts(
                hist,
                start=0.0,
                bucket_s=int(wl.history_bucket_s),
                horizon=horizon,
                models=models,
                backtest_folds=2,
            )
        except ValueError:
            continue  # no model accepts this history: no day-scale signal for it
        day[key] = np.asarray(res.yhat)
        day_mase[key] = res.backtest_mase
    return day, day_mase


def oracle_demand(
    sim, t_idx, pid_arr, t: float, H: float, only, forecast_log: dict[str, list]
) -> dict[int, Demand]:
    """The oracle's demand: the true arrivals of the next ``H`` seconds per prefix (count,
    30-second peak, first arrival), the top ``MAX_CANDIDATES`` with two or more; each logged to
    ``forecast_log`` by key."""
    lo, hi = np.searchsorted(t_idx, [t, t + H])
    if hi <= lo:
        return {}
    pids = pid_arr[lo:hi]
    times = t_idx[lo:hi]
    if only is not None:
        sel = np.isin(pids, np.asarray(only))
        pids, times = pids[sel], times[sel]
        if not len(pids):
            return {}
    counts = np.bincount(pids)
    bucket = ((times - t) // 30.0).astype(np.int64)
    pairs = pids.astype(np.int64) * 1_000 + bucket
    uniq, pc = np.unique(pairs, return_counts=True)
    peak: dict[int, int] = {}
    for u, c in zip((uniq // 1_000).tolist(), pc.tolist(), strict=True):
        peak[u] = max(peak.get(u, 0), c)
    first: dict[int, float] = {}
    for p, tt in zip(pids.tolist(), times.tolist(), strict=True):
        if p not in first:
            first[p] = tt - t
    top = np.argsort(-counts)[:MAX_CANDIDATES]
    out = {}
    for p in top.tolist():
        if counts[p] < 2:
            break
        out[p] = Demand(str(p), float(counts[p]), 1.0, peak[p] / 30.0, 1.0, first[p])
        forecast_log.setdefault(sim.workload.prefix_wkey[p], []).append((t, float(counts[p]) / H))
    return out
