"""The planner's demand from forecasts: one model for the Celery planning path and the simulator.

``controlplane/replication/plans/inputs.py`` (with ``controlplane/forecasting/services/``, which
stores each key's burst risk) and the simulator's ``predictive`` policy
(``controlplane/sim/planned.py``) both turn a forecast into a ``planner.Demand`` here, so the
simulator evaluates what production runs:

- **Burst**: a burst is ``BURST_FACTOR`` x the key's rate (recent rate or forecast, the larger):
  ServeGen tenants' 1-minute rates cross twice their usual level when they burst.
- **Risk** (``burst_probability``): the chance that the key's arrivals in the horizon exceed a
  capacity, from its recent rate and inter-arrival CV (``core.forecast.burst_risk``: renewal
  counts, negative binomial when over-dispersed). The capacity is its holders' (requests/s they
  can take) where the caller knows them (the simulator re-plans with live holders every tick),
  else ``BURST_FACTOR`` x its recent rate (the forecast task, which runs before any plan and does
  not know the holders). One function, one definition; the capacity is the caller's knowledge.
- **Confidence**: ``1 / (1 + MASE)`` of the forecaster's rolling-origin backtest; a forecast as
  good as the naive one scores 0.5; one with no backtest (too little history) scores 0.5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from controlplane.core.forecast.burst import BURST_FACTOR, burst_risk
from controlplane.core.policy.types import Demand

UNSCORED_CONFIDENCE = 0.5


def confidence(backtest_mase: float | None) -> float:
    """``1 / (1 + MASE)``; 0.5 when the forecast has no backtest score."""
    if backtest_mase is None or not math.isfinite(backtest_mase):
        return UNSCORED_CONFIDENCE
    return 1.0 / (1.0 + max(0.0, float(backtest_mase)))


def burst_probability(
    recent_rate: float,
    interarrival_cv: float,
    horizon_s: float,
    window_s: float,
    capacity_rate: float | None = None,
) -> float:
    """P(arrivals in the next ``horizon_s`` > ``capacity_rate`` x ``horizon_s``); the capacity
    defaults to ``BURST_FACTOR`` x ``recent_rate`` (the holders unknown)."""
    if recent_rate <= 0:
        return 0.0
    cap = BURST_FACTOR * recent_rate if capacity_rate is None else capacity_rate
    return burst_risk(
        recent_rate=recent_rate,
        interarrival_cv=interarrival_cv,
        capacity_rate=max(0.0, cap),
        horizon_s=horizon_s,
        window_s=window_s,
    )


def risk_from_counts(
    counts: Sequence[float], bucket_s: float, horizon_s: float, capacity_rate: float | None = None
) -> float:
    """``burst_probability`` from recent bucketed counts: rate = mean / bucket; for a renewal
    process Var/mean of counts ~ CV^2 of the inter-arrival times, so CV = sqrt(Var / mean)."""
    xs = [float(c) for c in counts]
    if not xs:
        return 0.0
    mean = sum(xs) / len(xs)
    if mean <= 0:
        return 0.0
    var = sum((x - mean) ** 2 for x in xs) / len(xs)
    cv = math.sqrt(max(var / mean, 1e-6))
    return burst_probability(mean / bucket_s, cv, horizon_s, len(xs) * bucket_s, capacity_rate)


def demand_for(
    prefix_id: str,
    *,
    expected_requests: float,
    horizon_s: float,
    burst_probability: float,
    recent_rate: float = 0.0,
    backtest_mase: float | None = None,
    first_arrival_s: float = 0.0,
) -> Demand:
    """The planner's ``Demand`` of one prefix from its forecast (module docstring)."""
    if horizon_s <= 0:
        raise ValueError("horizon_s must be > 0")
    expected = max(0.0, float(expected_requests))
    rate = max(recent_rate, expected / horizon_s)
    return Demand(
        prefix_id,
        expected,
        min(1.0, max(0.0, burst_probability)),
        BURST_FACTOR * rate,
        confidence(backtest_mase),
        first_arrival_s,
    )
