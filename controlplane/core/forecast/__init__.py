"""Demand forecasting per workload key (no Django).

Two time scales (docs/forecasting.md):
- day scale: `forecast_counts` backtests Prophet and cheap baselines (last value, EWMA,
  seasonal naive, seasonal blend) on the key's own bucketed history and keeps the best by MASE;
- seconds to minutes: `burst_risk` / `BurstTracker`, the probability that a key's arrivals
  outrun what its current holders can serve.
"""
