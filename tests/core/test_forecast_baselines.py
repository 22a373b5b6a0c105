"""Baseline forecasters and series arithmetic on hand-checkable synthetic series."""

import numpy as np
import pytest

from controlplane.core.forecast.baselines import ewma_levels
from controlplane.core.forecast.select import FORECASTERS
from controlplane.core.forecast.series import aggregate, as_counts, mase, mase_scale, z_for


def fit_predict(name, history, horizon, bucket_s=3600):
    fitted = FORECASTERS[name].fit(np.asarray(history, float), bucket_s=bucket_s, end=0.0)
    return fitted.predict(horizon)


def test_last_value_repeats_the_last_bucket_with_a_widening_interval():
    p = fit_predict("last_value", [3, 5, 4, 8], 3)
    np.testing.assert_array_equal(p.yhat, [8, 8, 8])
    # one-step residuals 2, -1, 4: RMS sqrt(7); random-walk sd grows as sqrt(h)
    half = (p.upper - p.yhat) / z_for(0.8)
    np.testing.assert_allclose(half, np.sqrt(7) * np.sqrt([1, 2, 3]))
    assert (p.lower <= p.yhat).all() and (p.lower >= 0).all()


def test_ewma_levels_by_hand_and_alpha_choice():
    # alpha 0.5 from 4: 4 -> 4, then 4 + 0.5 * (8 - 4) = 6, then 6 + 0.5 * (0 - 6) = 3
    np.testing.assert_allclose(ewma_levels(np.array([4.0, 8.0, 0.0]), 0.5), [4, 6, 3])
    # A series that switches level once is best followed by the fastest smoothing
    step = [10.0] * 20 + [50.0] * 20
    assert fit_predict("ewma", step, 2).yhat[0] == pytest.approx(50, abs=0.5)
    # Pure alternation around 10 is best smoothed slowly: the forecast sits near the mean
    zigzag = [5.0, 15.0] * 20
    assert fit_predict("ewma", zigzag, 1).yhat[0] == pytest.approx(10, abs=1.5)


def test_seasonal_naive_repeats_yesterday():
    day = np.arange(24, dtype=float)
    history = np.concatenate([day + 100, day])  # two days of hourly buckets
    p = fit_predict("seasonal_naive", history, 30)
    np.testing.assert_array_equal(p.yhat, np.concatenate([day, day[:6]]))


def test_seasonal_blend_moves_from_recent_level_to_yesterday():
    day = np.zeros(24)
    day[12] = 100.0
    history = np.concatenate([day, day[:-1], [40.0]])
    p = fit_predict("seasonal_blend", history, 24)
    # lead 1 h: weight exp(-1/3) on the 30-min level (the last bucket, 40)
    w = np.exp(-1 / 3)
    assert p.yhat[0] == pytest.approx(w * 40 + (1 - w) * 0)
    # lead 13 h (index 12): mostly yesterday's 100 at the same hour
    w13 = np.exp(-13 / 3)
    assert p.yhat[12] == pytest.approx(w13 * 40 + (1 - w13) * 100)


def test_seasonal_models_refuse_less_than_a_day_and_odd_buckets():
    assert "more than 1 day" in FORECASTERS["seasonal_naive"].refusal(24, 3600)
    assert FORECASTERS["seasonal_naive"].refusal(25, 3600) is None
    assert "divides a day" in FORECASTERS["seasonal_blend"].refusal(10_000, 7 * 60 * 11)
    with pytest.raises(ValueError):
        fit_predict("seasonal_naive", np.ones(10), 2)


def test_mase_arithmetic():
    history = np.array([1.0, 3.0, 2.0, 6.0])  # lag-1 |diffs| 2, 1, 4 -> scale 7/3
    assert mase_scale(history) == pytest.approx(7 / 3)
    assert mase([5, 5], [4, 7], history) == pytest.approx(1.5 / (7 / 3))
    assert mase_scale(np.array([2.0, 2.0, 2.0])) == 1.0  # flat history: MASE = MAE
    with pytest.raises(ValueError):
        mase([1, 2], [1], history)


def test_aggregate_aligns_on_the_newest_bucket_and_input_validation():
    np.testing.assert_array_equal(aggregate(np.arange(7.0), 3), [1 + 2 + 3, 4 + 5 + 6])
    for bad in ([[1, 2]], [1, -1], [1, np.nan], ["a"]):
        with pytest.raises(ValueError):
            as_counts(bad)
