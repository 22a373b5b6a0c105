"""Per-key model choice by rolling-origin backtest, Prophet's minimum history, input errors."""

import numpy as np
import pytest

from controlplane.core.forecast.backtest import fold_origins
from controlplane.core.forecast.select import forecast_counts, forecast_many

BASELINES = ["last_value", "ewma", "seasonal_naive", "seasonal_blend"]
HOUR = 3600


def daily_cycle(days: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    hours = np.arange(days * 24)
    return rng.poisson(200 + 150 * np.sin(2 * np.pi * hours / 24)).astype(float)


def random_walk(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(500 + np.cumsum(rng.normal(0, 20, n)), 0)


def test_fold_origins_are_newest_non_overlapping_blocks():
    assert fold_origins(100, 10, 3, min_history=1) == [70, 80, 90]
    assert fold_origins(100, 10, 3, min_history=75) == [80, 90]
    assert fold_origins(12, 10, 3, min_history=1) == [2]
    assert fold_origins(11, 10, 3, min_history=1) == []


def test_clear_daily_cycle_picks_a_seasonal_model():
    y = daily_cycle(7)
    r = forecast_counts(y, start=7 * 86400.0, bucket_s=HOUR, horizon=12, models=BASELINES)
    assert r.model in ("seasonal_naive", "seasonal_blend")
    assert r.scores["seasonal_naive"] < r.scores["last_value"]
    assert r.backtest_mase == r.scores[r.model] and r.folds[r.model] == 3
    assert len(r.yhat) == len(r.lower) == len(r.upper) == 12
    assert (r.lower <= r.yhat).all() and (r.yhat <= r.upper).all()
    assert r.start == 7 * 86400.0 and r.bucket_s == HOUR


def test_random_walk_picks_persistence_over_seasonal_naive():
    y = random_walk(24 * 7)
    r = forecast_counts(y, start=0.0, bucket_s=HOUR, horizon=3, models=BASELINES)
    assert r.model in ("last_value", "ewma")
    assert r.scores["seasonal_naive"] > r.scores[r.model]
    assert r.yhat[0] == pytest.approx(y[-1], rel=0.1)


def test_prophet_refused_below_two_days_with_a_note():
    y = daily_cycle(1)[:18]  # 3 h of 10-minute buckets
    r = forecast_counts(y, start=0.0, bucket_s=600, horizon=6)
    assert "prophet" not in r.scores and r.model != "prophet"
    assert "only 3 h of history: baselines only, Prophet needs >= 2 days" in r.note
    with pytest.raises(ValueError, match="Prophet needs"):
        forecast_counts(y, start=0.0, bucket_s=600, horizon=6, models=["prophet"])


def test_too_short_to_backtest_falls_back_to_unscored_last_value():
    r = forecast_counts([4.0, 6.0], start=0.0, bucket_s=60, horizon=5)
    assert r.model == "last_value" and r.backtest_mase is None and r.scores == {}
    assert "too short to backtest" in r.note
    np.testing.assert_array_equal(r.yhat, [6.0] * 5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(counts=[]), "empty"),
        (dict(counts=[1, -2, 3]), "non-negative"),
        (dict(bucket_s=0), "bucket_s"),
        (dict(horizon=0), "horizon"),
        (dict(models=["arima"]), "unknown models"),
        (dict(interval=1.5), "interval"),
        (dict(start=float("nan")), "start"),
    ],
)
def test_bad_input_is_refused(kwargs, message):
    args = dict(counts=[1.0, 2.0, 3.0], start=0.0, bucket_s=60, horizon=2) | kwargs
    counts = args.pop("counts")
    with pytest.raises(ValueError, match=message):
        forecast_counts(counts, **args)


def test_forecast_many_in_a_pool_matches_inline():
    series = [(daily_cycle(3, seed), 0.0) for seed in range(4)]
    kw = dict(bucket_s=HOUR, horizon=6, models=BASELINES)
    pooled = forecast_many(series, workers=2, **kw)
    inline = forecast_many(series, workers=1, **kw)
    for a, b in zip(pooled, inline, strict=True):
        assert a.model == b.model and a.scores == b.scores
        np.testing.assert_array_equal(a.yhat, b.yhat)
