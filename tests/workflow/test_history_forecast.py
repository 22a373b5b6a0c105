"""History from day one: a fresh install with minutes of live demand forecasts with a baseline;
two days of imported history make the next forecast tick choose a day-scale model and give
Prophet its fit, in the first hour, as the simulator's predictive has them."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime

import numpy as np
import pytest

from controlplane.demand.history import import_history
from controlplane.demand.models import WorkloadKey
from controlplane.demand.services import ingest_records
from controlplane.forecasting.models import FittedModel, Forecast
from controlplane.forecasting.services import slow_fits, tick, window
from wire import blockhash

BUCKET_S = 600
HORIZON_S = 3600.0
DAY_SCALE = {"seasonal_naive", "seasonal_blend", "prophet"}
KEYS = [blockhash.to_hex(k) for k in (101, 102, 103)]
pytestmark = pytest.mark.django_db


@pytest.fixture
def fresh_install(settings):
    settings.PREWARM_DEMAND_BUCKET_SECONDS = BUCKET_S
    settings.PREWARM_FORECAST_TICK_DAYS = 3.0
    settings.PREWARM_FORECAST_MODELS = []
    window.reset_windows()
    yield
    window.reset_windows()


def daily(bucket: int) -> int:
    """The tenant's requests in 10-minute window ``bucket`` (unix time // 600): a daily cycle,
    the same every day, as the simulator's expected counts are."""
    return int(round(40 + 35 * np.sin(2 * np.pi * bucket / 144)))


def latest(key_id: int) -> Forecast:
    return Forecast.objects.filter(key_id=key_id).order_by("-id").first()


def test_imported_history_gives_day_scale_models_and_prophet_in_the_first_hour(fresh_install):
    now = time.time()
    # The install went live 40 minutes ago: its gateway has posted the tenant's requests since.
    live_from = int((now - 2400) // BUCKET_S)
    live = [
        {"time": t, "model": "m", "tenant": "acme", "keys": KEYS, "block_size": 512}
        for b in range(live_from, int(now // BUCKET_S) + 1)
        for t in b * BUCKET_S + np.arange(daily(b)) * BUCKET_S / daily(b)
        if t < now - 1
    ]
    ingest_records(live)
    wk = WorkloadKey.objects.get()
    stamp = tick.forecast_tick(HORIZON_S)
    assert stamp["forecast"] == 1 and stamp["window"] == "full"
    before = latest(wk.pk)
    assert before.model not in DAY_SCALE and before.note.startswith("baseline only")
    assert slow_fits.slow_fits_due() == []  # no key has the 2 days Prophet takes

    # Two days and an hour of the tenant's history, in 10-minute counts, up to its first
    # live record.
    n = int((2 * 86400 + 3600) // BUCKET_S)
    rows = [
        {
            "time": b * BUCKET_S,
            "seconds": BUCKET_S,
            "requests": daily(b),
            "prompt_tokens": daily(b) * 2000,
            "tenant": "acme",
            "model": "m",
            "prefix_group": KEYS[1],
        }
        for b in range(live_from - n, live_from)
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    imp, _ = import_history(io.BytesIO(text))
    assert imp.workload_keys == 1 and imp.workload_keys_created == 0 and imp.skipped_live == 0

    # The worker's window (read in full at the first tick) is read again: the import is newer.
    stamp = tick.forecast_tick(HORIZON_S)
    assert stamp["window"] == "full"
    after = latest(wk.pk)
    assert after.model in DAY_SCALE, after.note
    assert "baseline only" not in after.note and "prophet not fitted yet" in after.note

    # Prophet is due first (never fitted, two days of history); its fit and backtest then
    # reach the tick's forecast.
    assert slow_fits.slow_fits_due() == [wk.pk]
    fit = slow_fits.fit_slow_model(wk.pk, HORIZON_S)
    assert isinstance(fit, FittedModel) and fit.backtest_mase is not None
    tick.forecast_tick(HORIZON_S)
    third = latest(wk.pk)
    assert third.scores["prophet"] == pytest.approx(fit.backtest_mase)
    assert third.model in DAY_SCALE
    assert (third.model == "prophet") == fit.chosen


@pytest.mark.slow  # the ServeGen set-up takes seconds
def test_the_virtual_cluster_history_lands_on_the_keys_its_replay_makes(settings):
    """The demo's history rows (the trace's windows before the replay, counts x time scale)
    make the workload keys the replay's records then count under, with their shared prefix."""
    from controlplane.sim.scenarios import build
    from controlplane.sim.workloads.base import BLOCK_TOKENS
    from harness.virtual.history import history_rows

    settings.PREWARM_DEMAND_BUCKET_SECONDS = 60
    wl = build(workload="servegen", scenario="steady", engines=2, duration=60.0, tenants=3).workload
    now = time.time()
    rows = history_rows(wl, "m8b", 10.0, 1.0, now, sample_s=60.0)
    assert rows and now - 600 < max(r["time"] + r["seconds"] for r in rows) <= now + 1e-3
    # Drawn arrivals: the windows' expected counts x time scale, within the draws' noise.
    want = sum(float(c) * 10 for c in (h[-144:] for h in wl.history.values()) for c in c)
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    imp, _ = import_history(io.BytesIO(text))
    assert imp.requests == sum(r["requests"] for r in rows)
    assert abs(imp.requests - want) < 5 * want**0.5
    assert imp.workload_keys == len(wl.history) == 3
    records = [
        {
            "time": now + 1,
            "model": "m8b",
            "tenant": wl.prefix_wkey[pid],
            "keys": [blockhash.to_hex(k) for k in (*wl.prefixes[pid], 987654321 + pid)],
            "block_size": BLOCK_TOKENS,
        }
        for pid in range(len(wl.prefixes))
    ]
    assert ingest_records(records)["workload_keys_created"] == 0
    for wk in WorkloadKey.objects.all():
        pid = wl.prefix_wkey.index(wk.tenant)
        assert wk.prefix_keys == [blockhash.to_hex(k) for k in wl.prefixes[pid]]


@pytest.mark.slow  # the ServeGen set-up takes seconds
def test_the_real_engine_runs_history_lands_on_the_keys_their_taps_make(settings):
    """The real A/B's history rows (the slice's tenants, earlier days, counts x time scale, the
    tenant's prefix as token ids) make the workload keys the taps' records of the replayed
    requests then count under, with the tenant's prefix as the shared chain."""
    from harness.realvllm.presets import REAL_PRESETS

    settings.PREWARM_DEMAND_BUCKET_SECONDS = 60
    preset = REAL_PRESETS["real-heavy"]
    block = preset.model.block_size
    now = time.time()
    rows = preset.history(1.0, now, tenants=3, duration_s=600.0)
    assert rows and now - 600 < max(r["time"] + r["seconds"] for r in rows) <= now + 1e-3
    assert {r["model"] for r in rows} == {preset.model.served_name}
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    imp, _ = import_history(io.BytesIO(text))
    assert imp.requests == sum(r["requests"] for r in rows) and imp.workload_keys == 3
    requests = preset.requests(tenants=3, duration_s=600.0)
    first = {r.tenant: r for r in reversed(requests)}  # each tenant's first request
    assert set(first) == {r["tenant"] for r in rows}
    records = [  # as a tap records them: tenant header, body's model, the prompt's keys
        {
            "time": now + 1,
            "model": preset.model.served_name,
            "tenant": tenant,
            "keys": [blockhash.to_hex(k) for k in blockhash.request_keys(r.token_ids, block)],
            "block_size": block,
        }
        for tenant, r in first.items()
    ]
    assert ingest_records(records)["workload_keys_created"] == 0
    for wk in WorkloadKey.objects.all():
        prompts = [r.token_ids for r in requests if r.tenant == wk.tenant]
        shared = min(
            next((i for i, (a, b) in enumerate(zip(prompts[0], p, strict=False)) if a != b), 0)
            for p in prompts[1:]
        )
        assert len(wk.prefix_keys) == shared // block  # the tenant's prefix, its full blocks


@pytest.mark.slow  # the ServeGen set-up and two days of drawn arrivals take seconds
def test_the_demo_history_leaves_the_model_to_the_backtest(settings):
    """The demo's history, imported, is arrivals drawn per bucket, not each window's count
    spread evenly: evenly spread, every bucket of a window is the same and the last value
    forecasts the next bucket perfectly, so it wins every key's backtest whatever the day-scale
    models could do. Drawn, the last value is scored on the noise real arrivals have, and the
    backtest picks another model for some keys."""
    from controlplane.sim.scenarios import build
    from harness.virtual.history import history_rows

    settings.PREWARM_DEMAND_BUCKET_SECONDS = 60
    settings.PREWARM_FORECAST_MODELS = []
    window.reset_windows()
    wl = build(workload="servegen", scenario="steady", engines=2, duration=60.0, tenants=3).workload
    now = time.time()
    end = now // 60 * 60  # the history fills every bucket up to the tick's
    rows = history_rows(wl, "m8b", 10.0, 2.0, end, sample_s=60.0)
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    import_history(io.BytesIO(text))
    stamp = tick.forecast_tick(60.0, now=datetime.fromtimestamp(now, tz=UTC))
    window.reset_windows()
    assert stamp["forecast"] == 3
    chosen = {}
    for wk in WorkloadKey.objects.all():
        f = latest(wk.pk)
        assert f.backtest_mase is not None and "baseline only" not in f.note
        # the last value is not a perfect forecast of drawn arrivals
        assert f.scores["last_value"] > 0.1, (wk.tenant, f.scores)
        chosen[wk.tenant] = f.model
    assert set(chosen.values()) != {"last_value"}, chosen
