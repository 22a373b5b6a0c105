"""The forecast tick (every key at once, from the worker's demand window) stores what the per-key
path stores for the same data; a tick that reads only what is new agrees with one that reads
everything; Prophet's forecast is read from its fitted state, refitted off the tick path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from controlplane.demand.models import DemandBucket, WorkloadKey
from controlplane.forecasting.models import FittedModel, Forecast
from controlplane.forecasting.services import per_key, slow_fits, tick, window

BUCKET_S = 600
HORIZON_S = 3600.0
pytestmark = pytest.mark.django_db


@pytest.fixture
def tick_settings(settings):
    settings.PREWARM_DEMAND_BUCKET_SECONDS = BUCKET_S
    settings.PREWARM_FORECAST_HISTORY_DAYS = 4.0
    settings.PREWARM_FORECAST_TICK_DAYS = 4.0  # the same window as the per-key path: same data
    settings.PREWARM_FORECAST_MODELS = []
    return settings


def seed(now: datetime, n_keys: int, seed: int = 0) -> list[int]:
    """Keys with 1 bucket to 3.5 days of history of several shapes, ending at ``now``'s bucket."""
    rng = np.random.default_rng(seed)
    end = now.timestamp() // BUCKET_S * BUCKET_S
    ids, rows = [], []
    for i in range(n_keys):
        n = int(rng.integers(1, 3.5 * 144))
        t = np.arange(n)
        shape = [
            rng.poisson(6 + 5 * np.sin(2 * np.pi * t / 144)),
            rng.poisson(0.4, n),
            (rng.random(n) < 0.1) * rng.poisson(30, n),
        ][i % 3]
        k = WorkloadKey.objects.create(
            tenant=f"t{i}", model="m", prefix_group=f"{i:016x}", last_seen=now
        )
        ids.append(k.pk)
        for j, c in enumerate(shape):
            if c or j == 0:  # the first bucket is stored even when empty: it starts the history
                start = datetime.fromtimestamp(end - (n - j) * BUCKET_S, tz=UTC)
                rows.append(DemandBucket(key=k, start=start, seconds=BUCKET_S, requests=int(c)))
    DemandBucket.objects.bulk_create(rows)
    return ids


def latest(key_id: int) -> Forecast:
    return Forecast.objects.filter(key_id=key_id).order_by("-id").first()


def same(a: Forecast, b: Forecast) -> None:
    assert (a.model, a.start, a.horizon) == (b.model, b.start, b.horizon)
    for field in ("yhat", "lower", "upper"):
        np.testing.assert_allclose(getattr(a, field), getattr(b, field), rtol=1e-6, atol=1e-4)
    assert (a.backtest_mase is None) == (b.backtest_mase is None)
    if a.backtest_mase is not None:
        assert a.backtest_mase == pytest.approx(b.backtest_mase, rel=1e-9)
    assert a.burst_risk == pytest.approx(b.burst_risk, rel=1e-9, abs=1e-12)
    assert a.scores.keys() == b.scores.keys()


def test_the_tick_stores_what_the_per_key_path_stores(tick_settings):
    tick_settings.PREWARM_FORECAST_MODELS = [
        "last_value",
        "ewma",
        "seasonal_naive",
        "seasonal_blend",
    ]
    now = datetime(2026, 12, 1, 12, 3, tzinfo=UTC)
    ids = seed(now, 30)
    stamp = tick.forecast_tick(HORIZON_S, now=now)
    ticked = {k: latest(k) for k in ids}
    models = set()
    for k in ids:
        one = per_key.forecast_key(k, HORIZON_S, now=now)
        if one is None:  # no demand in its history: neither path forecasts it
            assert ticked[k] is None
            continue
        same(ticked[k], one)
        models.add(one.model)
    assert stamp["window"] == "full" and stamp["forecast"] == sum(
        f is not None for f in ticked.values()
    )
    assert len(models) >= 2 and stamp["forecast"] >= 20


def test_an_incremental_tick_agrees_with_a_full_read(tick_settings):
    now = datetime(2026, 12, 1, 12, 3, tzinfo=UTC)
    ids = seed(now, 12, seed=3)
    tick.forecast_tick(HORIZON_S, now=now)
    # Three buckets later: new demand on some keys, a late record in an already-read bucket,
    # and a key seen for the first time.
    later = now + timedelta(seconds=3 * BUCKET_S)
    end = later.timestamp() // BUCKET_S * BUCKET_S
    for j, k in enumerate(ids[:6]):
        DemandBucket.objects.create(
            key_id=k,
            start=datetime.fromtimestamp(end - BUCKET_S * (1 + j % 3), tz=UTC),
            seconds=BUCKET_S,
            requests=7 + j,
        )
    # The previous tick's newest bucket, read again: a record that arrived after it closed.
    DemandBucket.objects.update_or_create(
        key_id=ids[6],
        start=datetime.fromtimestamp(now.timestamp() // BUCKET_S * BUCKET_S - BUCKET_S, tz=UTC),
        seconds=BUCKET_S,
        defaults={"requests": 99},
    )
    fresh = WorkloadKey.objects.create(
        tenant="new", model="m", prefix_group="f" * 16, last_seen=later
    )
    DemandBucket.objects.create(
        key=fresh,
        start=datetime.fromtimestamp(end - 2 * BUCKET_S, tz=UTC),
        seconds=BUCKET_S,
        requests=5,
    )
    WorkloadKey.objects.update(last_seen=later)
    stamp = tick.forecast_tick(HORIZON_S, now=later)
    assert stamp["window"] == "incremental"
    incremental = {k: latest(k) for k in [*ids, fresh.pk]}
    window.reset_windows()
    assert tick.forecast_tick(HORIZON_S, now=later)["window"] == "full"
    assert latest(fresh.pk) is not None
    for k, f in incremental.items():
        if f is None:
            assert latest(k) is None
        else:
            same(f, latest(k))


def test_prophet_is_fitted_off_the_tick_and_read_from_its_state(tick_settings):
    """A key with a strong daily cycle: its slow fit is due, the refit stores Prophet's expected
    counts, and the next tick's forecast is what the per-key path (fitting Prophet inline) gives."""
    tick_settings.PREWARM_FORECAST_SLOW_FITS_PER_HOUR = 10
    now = datetime(2026, 12, 1, 12, 3, tzinfo=UTC)
    end = now.timestamp() // BUCKET_S * BUCKET_S
    rng = np.random.default_rng(1)
    t = np.arange(int(3.5 * 144))
    k = WorkloadKey.objects.create(tenant="cyc", model="m", prefix_group="c" * 16, last_seen=now)
    DemandBucket.objects.bulk_create(
        DemandBucket(
            key=k,
            start=datetime.fromtimestamp(end - (len(t) - j) * BUCKET_S, tz=UTC),
            seconds=BUCKET_S,
            requests=int(c),
        )
        for j, c in enumerate(rng.poisson(40 + 38 * np.sin(2 * np.pi * t / 144 - 1.0)))
    )
    young = WorkloadKey.objects.create(
        tenant="young", model="m", prefix_group="a" * 16, last_seen=now
    )
    DemandBucket.objects.bulk_create(  # 6 h of history: too young for Prophet
        DemandBucket(
            key=young,
            start=datetime.fromtimestamp(end - j * BUCKET_S, tz=UTC),
            seconds=BUCKET_S,
            requests=3,
        )
        for j in range(1, 37)
    )
    assert slow_fits.slow_fits_due(now=now, since_last_s=3600) == [k.pk]  # young: < 2 days
    fit = slow_fits.fit_slow_model(k.pk, HORIZON_S, now=now)
    assert fit is not None and fit.backtest_mase is not None and len(fit.values) > 1
    one = per_key.forecast_key(k.pk, HORIZON_S, now=now)
    assert fit.chosen and one.model == "prophet"  # a clean daily cycle: Prophet wins its fold
    tick.forecast_tick(HORIZON_S, now=now)
    ticked = latest(k.pk)
    assert ticked.scores["prophet"] == pytest.approx(one.scores["prophet"], rel=1e-6)
    same(ticked, one)
    assert "prophet won its backtest" in ticked.note
    assert "prophet" not in latest(young.pk).scores
    assert "Prophet needs >= 2 days" in latest(young.pk).note
    assert FittedModel.objects.count() == 1
    # Refitted now, so not due again before the never-fitted keys (none left) and within budget.
    assert slow_fits.slow_fits_due(now=now, since_last_s=360) == [k.pk]


def test_demand_of_inactive_keys_only_forecasts_nothing(tick_settings):
    now = datetime(2026, 12, 1, 12, 3, tzinfo=UTC)
    seed(now, 3)
    WorkloadKey.objects.update(last_seen=now - timedelta(days=30))  # buckets, but no active key
    assert tick.forecast_tick(HORIZON_S, now=now) == {
        "keys": 0,
        "forecast": 0,
        "window": "full",
    }
    assert not Forecast.objects.exists()
