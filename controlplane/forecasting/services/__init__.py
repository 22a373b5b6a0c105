"""Forecast workload keys from their demand buckets and store the results (worker side).

The forecast tick (``forecast_tick``) forecasts every active key at once: the demand of all keys
is one right-aligned matrix kept by the worker process between ticks (``DemandWindow``; each tick
reads only the buckets since the last one, in one query), the baselines, their backtest, the
choice and burst risk are array work (``core.forecast.arrays``), and Prophet's forecast is read
from its fitted state (``FittedModel``), which ``fit_slow_model`` refits off the tick path on the
``forecast-slow`` queue, a few keys per tick under ``PREWARM_FORECAST_SLOW_FITS_PER_HOUR``.

``forecast_key`` is the per-key path (one key, every model, Prophet fitted inline). It calls the pure forecasters (``controlplane.core.forecast``): every model that accepts the key's
history is backtested and the best kept; a key with too little history gets the baseline the
forecasters fall back to, and the stored ``note`` says so. Burst risk is the chance that the
next horizon brings more than ``core.demand.BURST_FACTOR`` x the recent rate, from the recent
rate and the dispersion of recent bucket counts: ``controlplane.core.demand.risk_from_counts``, the demand
model the simulator's predictive policy shares.
"""

from .per_key import RECENT_BUCKETS, forecast_key, risk_of
from .slow_fits import SLOW_FIT_SPAN, SLOW_MODEL, fit_slow_model, slow_fits_due
from .storage import history, keys_to_forecast, prune_forecasts
from .tick import forecast_tick
from .window import REREAD_BUCKETS, WINDOW_MAX_AGE_S, DemandWindow, demand_window, reset_windows

__all__ = [
    "RECENT_BUCKETS",
    "REREAD_BUCKETS",
    "SLOW_FIT_SPAN",
    "SLOW_MODEL",
    "WINDOW_MAX_AGE_S",
    "DemandWindow",
    "demand_window",
    "fit_slow_model",
    "forecast_key",
    "forecast_tick",
    "history",
    "keys_to_forecast",
    "prune_forecasts",
    "reset_windows",
    "risk_of",
    "slow_fits_due",
]
