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
