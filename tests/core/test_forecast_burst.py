"""Burst risk against Monte-Carlo renewal processes, and the online tracker on real arrivals."""

import json
import math

import numpy as np
import pytest

from controlplane.core.forecast.burst import BurstTracker, burst_risk
from controlplane.core.traces.paths import shared_data_dir

# Inter-arrival fits of real ServeGen m-large windows (chunk-0-trace.csv rows 1, 3, 4).
SERVEGEN_FITS = [
    ("weibull", 0.3753486140101707, 0.3967677807107179),
    ("weibull", 0.4949831672353574, 3.3810771356697296),
    ("gamma", 0.060422107316638725, 103.65095274189687),
]


def renewal(kind, shape, scale):
    """(sampler, rate, cv) of a Gamma or Weibull renewal process."""
    if kind == "gamma":
        return (lambda rng, n: rng.gamma(shape, scale, n)), 1 / (shape * scale), shape**-0.5
    g1, g2 = math.gamma(1 + 1 / shape), math.gamma(1 + 2 / shape)
    return (
        (lambda rng, n: scale * rng.weibull(shape, n)),
        1 / (scale * g1),
        math.sqrt(g2 / g1**2 - 1),
    )


def stationary_counts(sample, horizon_s, rng, n=300_000, windows=20_000):
    t = np.cumsum(sample(rng, n))
    starts = rng.uniform(0.05 * t[-1], t[-1] - horizon_s, windows)  # past the first arrival
    return np.searchsorted(t, starts + horizon_s) - np.searchsorted(t, starts)


@pytest.mark.parametrize("fit", SERVEGEN_FITS)
@pytest.mark.parametrize("horizon_s", [60.0, 600.0])
def test_matches_monte_carlo_of_servegen_renewal_processes(fit, horizon_s):
    rng = np.random.default_rng(7)
    sample, rate, cv = renewal(*fit)
    counts = stationary_counts(sample, horizon_s, rng)
    for factor in (1.0, 1.5, 2.0, 3.0):
        predicted = burst_risk(
            recent_rate=rate,
            interarrival_cv=cv,
            capacity_rate=factor * rate,
            horizon_s=horizon_s,
            window_s=math.inf,
        )
        observed = np.mean(counts > math.floor(factor * rate * horizon_s))
        # Measured worst gap 0.06, at the median (factor 1) of short bursty horizons
        assert predicted == pytest.approx(observed, abs=0.07), (factor, predicted, observed)


def test_monotonic_in_rate_cv_and_horizon():
    base = dict(recent_rate=1.0, interarrival_cv=2.0, capacity_rate=1.5, horizon_s=60.0)
    rates = [burst_risk(**base | {"recent_rate": r}) for r in (0.5, 1.0, 1.4, 2.0, 4.0)]
    assert rates == sorted(rates) and rates[0] < 0.05 and rates[-1] > 0.95
    cvs = [burst_risk(**base | {"interarrival_cv": c}) for c in (0.5, 1.0, 2.0, 4.0)]
    assert cvs == sorted(cvs) and cvs[0] < cvs[-1]
    # Capacity above the rate: a longer horizon averages bursts out, so the risk falls;
    # capacity below the rate: it rises, toward certainty when the rate is known exactly and
    # toward the doubt that 60 s of arrivals leave about the rate otherwise.
    above = [burst_risk(**base | {"horizon_s": h}) for h in (10, 60, 600, 6000)]
    assert above == sorted(above, reverse=True)
    for window_s, limit in ((math.inf, 0.99), (60.0, 0.7)):
        below = [
            burst_risk(**base | {"capacity_rate": 0.8, "horizon_s": h, "window_s": window_s})
            for h in (10, 60, 600, 6000)
        ]
        assert below == sorted(below) and below[-1] > limit


def test_a_short_rate_window_adds_uncertainty():
    args = dict(recent_rate=1.0, interarrival_cv=1.0, capacity_rate=1.5, horizon_s=60.0)
    assert burst_risk(**args, window_s=10.0) > burst_risk(**args, window_s=600.0)
    assert burst_risk(**args, window_s=600.0) > burst_risk(**args, window_s=math.inf)


def test_edge_cases_and_bad_input():
    assert burst_risk(recent_rate=0, interarrival_cv=3, capacity_rate=1, horizon_s=60) == 0
    # Perfectly regular arrivals: certain overload when the rate beats capacity, none otherwise
    regular = dict(interarrival_cv=0.0, horizon_s=60.0, window_s=math.inf)
    assert burst_risk(recent_rate=2, capacity_rate=1, **regular) == 1.0
    assert burst_risk(recent_rate=1, capacity_rate=2, **regular) == 0.0
    for bad in (dict(recent_rate=-1), dict(interarrival_cv=math.nan), dict(window_s=0)):
        args = dict(recent_rate=1.0, interarrival_cv=1.0, capacity_rate=1.0, horizon_s=1.0)
        with pytest.raises(ValueError):
            burst_risk(**args | bad)


def mooncake_arrivals() -> np.ndarray:
    path = shared_data_dir() / "traces/mooncake/conversation_trace.jsonl"
    with path.open() as fh:
        return np.array([json.loads(line)["timestamp"] / 1000 for line in fh])


def test_tracker_matches_a_batch_computation_on_the_mooncake_trace():
    t = mooncake_arrivals()  # 12,031 real arrivals, quantised to ~3 s (many simultaneous)
    tau = 60.0
    tracker = BurstTracker(window_s=tau, start=0.0)
    times, sizes = np.unique(t, return_counts=True)
    for ti, n in zip(times, sizes, strict=True):
        tracker.observe(float(ti), int(n))
    now = float(times[-1]) + 5.0
    # Batch: exponentially weighted arrivals over the weighted exposure since start
    expected_rate = np.sum(np.exp(-(now - t) / tau)) / (tau * (1 - np.exp(-now / tau)))
    assert tracker.rate(now) == pytest.approx(expected_rate, rel=1e-9)
    # Batch CV: one gap per arrival after the first (zero within a timestamp), each weighted
    # by the decay since the arrival that ends it
    gaps = np.diff(np.sort(t))
    w = np.exp(-(t[-1] - np.sort(t)[1:]) / tau)
    mean = np.sum(w * gaps) / np.sum(w)
    sd = math.sqrt(np.sum(w * gaps**2) / np.sum(w) - mean**2)
    assert tracker.cv(now) == pytest.approx(sd / mean, rel=1e-6)
    # The trace's mean rate is 12,031 / ~3,540 s = 3.4/s; the last minute is in that range
    assert 0.5 < tracker.rate(now) < 20
    risk_low = tracker.risk(now, capacity_rate=10 * tracker.rate(now), horizon_s=30)
    risk_high = tracker.risk(now, capacity_rate=0.5 * tracker.rate(now), horizon_s=30)
    assert 0 <= risk_low < 0.05 and risk_high > 0.9


def test_tracker_rate_of_a_steady_poisson_stream_and_time_order():
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(0.5, 4000))  # 2 req/s
    tracker = BurstTracker(window_s=300.0)
    for ti in arrivals:
        tracker.observe(float(ti))
    assert tracker.rate(float(arrivals[-1])) == pytest.approx(2.0, rel=0.15)
    assert tracker.cv(float(arrivals[-1])) == pytest.approx(1.0, abs=0.15)
    with pytest.raises(ValueError, match="time order"):
        tracker.observe(float(arrivals[-1]) - 1)
    with pytest.raises(ValueError):
        tracker.observe(float(arrivals[-1]) + 1, n=0)
    empty = BurstTracker()
    assert empty.rate(10.0) == 0 and empty.cv(10.0) == 1.0 and empty.risk(10.0, 1.0, 5.0) == 0
