"""Per-key model choice: backtest every candidate on the key's own history, keep the best.

`forecast_counts` is what the forecast task and the simulator's `predictive` policy call per
workload key; `forecast_many` runs it over many keys in a process pool (Prophet is CPU-bound and
holds the GIL, so threads would not help).

Selection: each candidate gets a rolling-origin backtest (`backtest.py`). Prophet gets at most
`PROPHET_BACKTEST_FOLDS` folds (the newest), because each fold is a Stan fit; a model with fewer
folds is compared with the incumbent on the folds both have, so Prophet's single newest fold is
judged against the baselines' errors on that same fold, not against their 3-fold mean.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from controlplane.core.forecast.backtest import BacktestScore, backtest
from controlplane.core.forecast.baselines import (
    Ewma,
    Fitted,
    Forecaster,
    LastValue,
    SeasonalBlend,
    SeasonalNaive,
)
from controlplane.core.forecast.prophet_model import ProphetForecaster
from controlplane.core.forecast.series import as_counts

FORECASTERS: dict[str, Forecaster] = {
    f.name: f for f in (LastValue(), Ewma(), SeasonalNaive(), SeasonalBlend(), ProphetForecaster())
}
PROPHET_BACKTEST_FOLDS = 1
#: Used when no candidate can be backtested (a history shorter than horizon + 2 buckets).
FALLBACK_MODEL = "last_value"


@dataclass(frozen=True)
class ForecastResult:
    """The chosen forecast of one key, with how it was chosen."""

    model: str
    start: float
    bucket_s: int
    yhat: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    backtest_mase: float | None
    scores: dict[str, float]
    note: str
    folds: dict[str, int] = field(default_factory=dict)  # backtest folds per scored model
    fitted: Fitted | None = field(default=None, repr=False, compare=False)  # the chosen model


def _validate(
    counts: object, start: float, bucket_s: int, horizon: int, models: Sequence[str] | None
) -> tuple[np.ndarray, list[str]]:
    arr = as_counts(counts)
    if len(arr) == 0:
        raise ValueError("counts is empty: no history to forecast from")
    if not isinstance(bucket_s, int | np.integer) or bucket_s <= 0:
        raise ValueError(f"bucket_s must be a positive integer, got {bucket_s!r}")
    if not isinstance(horizon, int | np.integer) or horizon <= 0:
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    if not math.isfinite(start):
        raise ValueError("start must be a finite unix time")
    names = list(FORECASTERS) if models is None else list(models)
    unknown = [m for m in names if m not in FORECASTERS]
    if unknown or not names:
        raise ValueError(f"unknown models {unknown}; known: {sorted(FORECASTERS)}")
    return arr, names


def _choose(scores: dict[str, BacktestScore]) -> str:
    # Most folds first, then lowest mean: challengers with fewer folds meet the incumbent on
    # the folds they share.
    order = sorted(scores, key=lambda m: (-len(scores[m].fold_mase), scores[m].mean))
    best = order[0]
    for challenger in order[1:]:
        common = set(scores[challenger].fold_mase) & set(scores[best].fold_mase)
        if scores[challenger].mean_over(common) < scores[best].mean_over(common):
            best = challenger
    return best


def forecast_counts(
    counts: np.ndarray,
    *,
    start: float,
    bucket_s: int,
    horizon: int,
    models: Sequence[str] | None = None,
    interval: float = 0.8,
    backtest_folds: int = 3,
) -> ForecastResult:
    """Forecast the next `horizon` buckets of a key's request counts with its best model.

    `counts` are per bucket, oldest first, the last bucket ending at `start`. Every candidate in
    `models` (default: all of `FORECASTERS`) that accepts the history length is backtested with
    `backtest_folds` rolling origins (Prophet with at most `PROPHET_BACKTEST_FOLDS`); the lowest
    MASE wins and is refitted on the whole history. Prophet is refused below 2 days of history,
    and `note` says so. Raises `ValueError` for malformed input or when no requested model
    accepts the history.
    """
    arr, names = _validate(counts, start, bucket_s, horizon, models)
    if backtest_folds < 0:
        raise ValueError("backtest_folds must be >= 0")
    notes: list[str] = []
    eligible = []
    for name in names:
        refusal = FORECASTERS[name].refusal(len(arr), bucket_s)
        if refusal:
            notes.append(refusal)
        else:
            eligible.append(name)
    if not eligible:
        raise ValueError("no requested model accepts this history: " + "; ".join(notes))

    scores: dict[str, BacktestScore] = {}
    for name in eligible:
        folds = min(backtest_folds, PROPHET_BACKTEST_FOLDS) if name == "prophet" else backtest_folds
        score = backtest(
            arr,
            FORECASTERS[name],
            bucket_s=bucket_s,
            end=start,
            horizon=horizon,
            folds=folds,
        )
        if score is not None:
            scores[name] = score

    if scores:
        chosen = _choose(scores)
        chosen_mase: float | None = scores[chosen].mean
        n_folds = len(scores[chosen].fold_mase)
        notes.append(f"{chosen} backtested best (MASE {chosen_mase:.3g}, {n_folds} folds)")
    else:
        chosen = FALLBACK_MODEL if FALLBACK_MODEL in eligible else eligible[0]
        chosen_mase = None
        notes.append(f"history too short to backtest a {horizon}-bucket horizon: {chosen} unscored")

    fitted = FORECASTERS[chosen].fit(arr, bucket_s=bucket_s, end=start)
    prediction = fitted.predict(horizon, interval)
    return ForecastResult(
        model=chosen,
        start=float(start),
        bucket_s=int(bucket_s),
        yhat=prediction.yhat,
        lower=prediction.lower,
        upper=prediction.upper,
        backtest_mase=chosen_mase,
        scores={m: s.mean for m, s in scores.items()},
        note="; ".join(notes),
        folds={m: len(s.fold_mase) for m, s in scores.items()},
        fitted=fitted,
    )


def _forecast_job(job: tuple[np.ndarray, float, dict]) -> ForecastResult:
    counts, start, kwargs = job
    # The fitted model stays in the pool process: a Prophet fit is heavy to send back.
    return replace(forecast_counts(counts, start=start, **kwargs), fitted=None)


def forecast_many(
    series: Sequence[tuple[np.ndarray, float]],
    *,
    bucket_s: int,
    horizon: int,
    models: Sequence[str] | None = None,
    interval: float = 0.8,
    backtest_folds: int = 3,
    workers: int | None = None,
) -> list[ForecastResult]:
    """`forecast_counts` for each `(counts, start)` in `series`, in order, over `workers`
    processes (default: the CPUs this process may use); `workers=1` runs inline."""
    kwargs = dict(
        bucket_s=bucket_s,
        horizon=horizon,
        models=models,
        interval=interval,
        backtest_folds=backtest_folds,
    )
    jobs = [(counts, start, kwargs) for counts, start in series]
    workers = workers or len(os.sched_getaffinity(0))
    if workers <= 1 or len(jobs) <= 1:
        return [_forecast_job(job) for job in jobs]
    chunksize = max(1, len(jobs) // (workers * 8))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_forecast_job, jobs, chunksize=chunksize))
