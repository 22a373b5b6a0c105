"""One demand model (core.demand) for the Celery planning path and the simulator."""

import pytest

from controlplane.core import demand as dm
from controlplane.core.forecast.burst import burst_risk


def test_confidence_rule():
    assert dm.confidence(None) == 0.5 and dm.confidence(float("nan")) == 0.5
    assert dm.confidence(1.0) == 0.5 and dm.confidence(0.0) == 1.0
    assert dm.confidence(3.0) == pytest.approx(0.25) and dm.confidence(-1.0) == 1.0


def test_risk_against_holders_or_the_burst_factor():
    # Unknown holders: the burst is BURST_FACTOR x the recent rate.
    assert dm.burst_probability(1.0, 2.0, 60.0, 120.0) == pytest.approx(
        burst_risk(
            recent_rate=1.0, interarrival_cv=2.0, capacity_rate=2.0, horizon_s=60.0, window_s=120.0
        )
    )
    # Holders that can take less than the rate: the risk is high; far more: low.
    assert dm.burst_probability(1.0, 2.0, 60.0, 120.0, capacity_rate=0.5) > 0.9
    assert dm.burst_probability(1.0, 2.0, 60.0, 120.0, capacity_rate=10.0) < 0.01
    assert dm.burst_probability(0.0, 2.0, 60.0, 120.0) == 0.0


def test_risk_from_counts_matches_the_rate_and_dispersion():
    counts = [3, 0, 9, 1, 0, 12, 2, 0, 5, 8]
    mean = sum(counts) / 10
    var = sum((c - mean) ** 2 for c in counts) / 10
    expect = dm.burst_probability(mean / 60, (var / mean) ** 0.5, 300.0, 600.0)
    assert dm.risk_from_counts(counts, 60, 300.0) == pytest.approx(expect)
    assert dm.risk_from_counts([0, 0], 60, 300.0) == 0.0 and dm.risk_from_counts([], 60, 1.0) == 0.0


def test_demand_for_builds_the_planners_demand():
    d = dm.demand_for(
        "p",
        expected_requests=60.0,
        horizon_s=120.0,
        burst_probability=0.3,
        recent_rate=2.0,
        backtest_mase=1.0,
    )
    assert (d.prefix_id, d.expected_requests, d.burst_probability) == ("p", 60.0, 0.3)
    assert d.peak_rate == pytest.approx(dm.BURST_FACTOR * 2.0) and d.confidence == 0.5
    d = dm.demand_for("p", expected_requests=600.0, horizon_s=120.0, burst_probability=2.0)
    assert d.peak_rate == pytest.approx(dm.BURST_FACTOR * 5.0) and d.burst_probability == 1.0
    with pytest.raises(ValueError):
        dm.demand_for("p", expected_requests=1.0, horizon_s=0.0, burst_probability=0.0)


def test_the_simulator_and_the_planning_path_share_it():
    import inspect

    from controlplane.sim import planned, planned_forecast

    src = inspect.getsource(planned) + inspect.getsource(planned_forecast)
    assert "demand_for(" in src and "BURST_FACTOR = " not in src
    from controlplane.core import demand
    from controlplane.core.forecast import burst

    assert "BURST_FACTOR = " not in inspect.getsource(demand)  # imported, defined once
    assert "BURST_FACTOR = 2.0" in inspect.getsource(burst) and demand.BURST_FACTOR == 2.0
