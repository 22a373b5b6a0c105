"""Prophet as a candidate: it fits a daily shape and wins where averaging over days pays."""

import numpy as np

from controlplane.core.forecast.select import FORECASTERS, forecast_counts


def test_prophet_learns_a_noisy_daily_shape_and_beats_persistence():
    rng = np.random.default_rng(3)
    buckets = np.arange(6 * 144)  # 6 days of 10-minute buckets
    mean = 100 + 80 * np.sin(2 * np.pi * buckets / 144)
    y = rng.poisson(mean).astype(float)
    end = 6 * 86400.0
    p = FORECASTERS["prophet"].fit(y, bucket_s=600, end=end).predict(144)
    truth = 100 + 80 * np.sin(2 * np.pi * (buckets[-1] + 1 + np.arange(144)) / 144)
    assert np.mean(np.abs(p.yhat - truth)) < 12  # Poisson noise alone is ~10 per bucket
    inside = np.mean((truth >= p.lower) & (truth <= p.upper))
    assert inside > 0.9

    r = forecast_counts(y, start=end, bucket_s=600, horizon=72)
    assert r.folds["prophet"] == 1 and r.folds["last_value"] == 3
    assert r.scores["prophet"] < r.scores["last_value"]
    assert r.model in ("prophet", "seasonal_blend", "seasonal_naive", "ewma")
