"""The array path (every key at once) against the per-key path on the same histories: the same
model chosen, forecasts, intervals, backtest scores and folds, and the same burst risk."""

import numpy as np
import pytest

from controlplane.core.demand import risk_from_counts
from controlplane.core.forecast.arrays import (
    _NEGBIN_CHUNK_CELLS,
    ARRAY_MODELS,
    burst_risk_arrays,
    forecast_arrays,
    right_aligned,
)
from controlplane.core.forecast.select import forecast_counts


def histories(n_keys: int, max_len: int, seed: int) -> list[np.ndarray]:
    """Keys of every kind the fleet has: daily cycles, drifting levels, idle keys with rare bursts,
    sparse trickles; lengths from one bucket to a few days, so folds and seasons come and go."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_keys):
        n = int(rng.integers(1, max_len))
        t = np.arange(n)
        kind = i % 4
        if kind == 0:
            s = rng.poisson(5 + 4 * np.sin(2 * np.pi * t / 144), n)
        elif kind == 1:
            s = np.maximum(0, 50 + np.cumsum(rng.normal(0, 3, n)))
        elif kind == 2:
            s = rng.poisson(0.3, n)
        else:
            s = (rng.random(n) < 0.05) * rng.poisson(40, n)
        out.append(np.asarray(s, dtype=np.float64))
    return out


@pytest.mark.parametrize(
    ("bucket_s", "horizon", "folds"), [(600, 12, 3), (600, 1, 2), (3600, 6, 3)]
)
def test_every_key_as_the_per_key_path_has_it(bucket_s, horizon, folds):
    series = histories(160, 500, seed=bucket_s + horizon)
    y, lengths = right_aligned(series)
    res = forecast_arrays(y, lengths, bucket_s=bucket_s, horizon=horizon, backtest_folds=folds)
    seen_models = set()
    for i, s in enumerate(series):
        one = forecast_counts(
            s,
            start=0.0,
            bucket_s=bucket_s,
            horizon=horizon,
            models=list(ARRAY_MODELS),
            backtest_folds=folds,
        )
        assert res.model_name(i) == one.model, (i, len(s))
        seen_models.add(one.model)
        for got, want in (
            (res.yhat[i], one.yhat),
            (res.lower[i], one.lower),
            (res.upper[i], one.upper),
        ):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
        scores = res.scores_of(i)
        assert scores.keys() == one.scores.keys()
        for m, v in one.scores.items():
            assert scores[m] == pytest.approx(v, rel=1e-9), (i, m)
            assert res.folds[i, res.models.index(m)] == one.folds[m]
        if one.backtest_mase is None:
            assert np.isnan(res.backtest_mase[i])
        else:
            assert res.backtest_mase[i] == pytest.approx(one.backtest_mase, rel=1e-9)
    # The data exercise the choice: more than one model wins somewhere.
    assert len(seen_models) >= 2


def test_a_subset_of_models_and_an_unscored_key():
    series = [np.array([3.0]), np.array([1.0, 2.0, 4.0]), np.arange(40.0)]
    y, lengths = right_aligned(series)
    res = forecast_arrays(y, lengths, bucket_s=600, horizon=5, models=["ewma", "last_value"])
    for i, s in enumerate(series):
        one = forecast_counts(s, start=0.0, bucket_s=600, horizon=5, models=["ewma", "last_value"])
        assert res.model_name(i) == one.model
        np.testing.assert_allclose(res.yhat[i], one.yhat, rtol=1e-12)
    assert np.isnan(res.backtest_mase[0]) and res.model_name(0) == "last_value"


def test_bad_input_is_refused():
    y, lengths = right_aligned([np.array([1.0, 2.0])])
    with pytest.raises(ValueError, match="no array form"):
        forecast_arrays(y, lengths, bucket_s=600, horizon=2, models=["prophet"])
    with pytest.raises(ValueError, match="non-negative"):
        forecast_arrays(-y, lengths, bucket_s=600, horizon=2)
    with pytest.raises(ValueError, match="1..width"):
        forecast_arrays(y, np.array([0]), bucket_s=600, horizon=2)


def test_burst_risk_of_every_key_as_risk_from_counts():
    rng = np.random.default_rng(5)
    series = histories(200, 40, seed=9)
    # Under-dispersed keys (the Normal tail), keys with fewer than RECENT_BUCKETS buckets, and
    # hot bursty keys whose negative-binomial tails fill more than one chunk of the table.
    series += [np.full(12, 30.0), np.array([4.0, 5.0, 4.0, 5.0]), np.array([2.0]), np.zeros(5)]
    hot = [
        rng.poisson(8000, 12) * rng.integers(1, 3, 12)
        for _ in range(3 * _NEGBIN_CHUNK_CELLS // 20000)
    ]
    series += [h.astype(float) for h in hot]
    y, lengths = right_aligned(series)
    for horizon_s in (60.0, 600.0, 3600.0):
        got = burst_risk_arrays(y, lengths, 600, horizon_s)
        want = [risk_from_counts(s[-10:], 600, horizon_s) for s in series]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert 0 < got.max() <= 1
