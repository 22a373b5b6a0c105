"""The one demand rule: what the planner provisions a prefix for, live and simulated, under
either strategy. ``reactive`` plans on measured demand; ``predictive`` is reactive plus
foresight, so it plans on the same measured demand and adds what a forecast sees ahead of it.

- **Measured**: the prefix's requests over the last ``MEASURE_WINDOW_S``, as a rate held over
  the horizon, certain (confidence 1). Where a burst's onset shows (``core.policy.onset``), the
  onset's rate is the rate now. Nothing a forecast says lowers it.
- **Forecast** (``predictive`` only): the forecast's rate (its expected requests over the
  horizon, and its burst probability towards its peak, ``planner._rate``) adds what it sees
  beyond the measured rate, weighted by its confidence; a forecast below ``min_confidence``
  adds nothing.

The ``Demand`` it returns is certain (confidence 1: the forecast's is in its part of the rate),
and names both parts (``measured_rate``, ``forecast_rate``) for the plan summary.
"""

from __future__ import annotations

from controlplane.core.policy.types import Demand

MEASURE_WINDOW_S = 60.0  # measured demand: the requests of the last minute


def forecast_rate(d: Demand, horizon_s: float) -> float:
    """Requests/s a forecast's demand provisions for: its mean over the horizon, and its burst
    probability towards its peak (the planner's ``lam``)."""
    mean = d.expected_requests / horizon_s
    return mean + d.burst_probability * max(0.0, d.peak_rate - mean)


def combined(
    prefix_id: str,
    *,
    measured_rate: float,
    horizon_s: float,
    forecast: Demand | None = None,
    onset_rate: float = 0.0,
    min_confidence: float,
) -> Demand:
    """The demand of one prefix (module doc): the measured rate (or the onset's, the larger),
    plus the forecast's excess over it times its confidence."""
    if horizon_s <= 0:
        raise ValueError("horizon_s must be > 0")
    now = max(0.0, measured_rate, onset_rate)
    rate, f_rate, first = now, 0.0, 0.0
    if forecast is not None:
        f_rate = forecast_rate(forecast, horizon_s)
        if forecast.confidence >= min_confidence:
            rate = now + forecast.confidence * max(0.0, f_rate - now)
        if now <= 0:
            first = forecast.first_arrival_s
    return Demand(
        prefix_id,
        rate * horizon_s,
        0.0,
        rate,
        1.0,
        first,
        measured_rate=now,
        forecast_rate=f_rate,
    )
