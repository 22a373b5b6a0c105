"""Demand forecasting per workload key (no Django).

Two time scales (docs/forecasting.md):
- day scale: `forecast_counts` backtests Prophet and cheap baselines (last value, EWMA,
  seasonal naive, seasonal blend) on the key's own bucketed history and keeps the best by MASE;
- seconds to minutes: `burst_risk` / `BurstTracker`, the probability that a key's arrivals
  outrun what its current holders can serve.
"""

from controlplane.core.forecast.backtest import BacktestScore, backtest
from controlplane.core.forecast.baselines import Fitted, Forecaster, Prediction
from controlplane.core.forecast.burst import BurstTracker, burst_risk, count_moments
from controlplane.core.forecast.prophet_model import MIN_HISTORY_S as PROPHET_MIN_HISTORY_S
from controlplane.core.forecast.select import (
    FORECASTERS,
    PROPHET_BACKTEST_FOLDS,
    ForecastResult,
    forecast_counts,
    forecast_many,
)
from controlplane.core.forecast.series import mase

__all__ = [
    "FORECASTERS",
    "PROPHET_BACKTEST_FOLDS",
    "PROPHET_MIN_HISTORY_S",
    "BacktestScore",
    "BurstTracker",
    "Fitted",
    "ForecastResult",
    "Forecaster",
    "Prediction",
    "backtest",
    "burst_risk",
    "count_moments",
    "forecast_counts",
    "forecast_many",
    "mase",
]
