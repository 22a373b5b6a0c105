"""The forecast tick of ``bench/forecast.py --tick`` on PostgreSQL: 10,000 keys' demand in the
database, ``forecasting.services.forecast_tick`` run the way the ``forecast`` worker runs it.

The keys (``bench/forecast.py``'s ServeGen m-large construction) are written with the last
``PREWARM_FORECAST_TICK_DAYS`` of their history as demand buckets ending at the current bucket
(COPY, untimed). Then, timed, in this one process (one worker): a cold tick (the worker's window
read in full, one query), then one bucket later, with each key's next bucket written, the
incremental tick (only the new and re-read buckets). Each stores a Forecast per key.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from tempfile import TemporaryDirectory

from _forecast_celery import BUCKET_S, _env, _seed

from controlplane.core.policy.knobs import HORIZON_S

TICK_DAYS = 3.0


def run(keys, horizon_s: float = float(HORIZON_S.default)) -> dict:
    window = int(TICK_DAYS * 86400 // BUCKET_S)
    with TemporaryDirectory() as tmp:
        env = _env(tmp)
        env["PREWARM_FORECAST_TICK_DAYS"] = str(TICK_DAYS)
        os.environ.update(env)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from controlplane.demand.models import DemandBucket, WorkloadKey
        from controlplane.forecasting.models import Forecast
        from controlplane.forecasting.services import tick
        from controlplane.forecasting.services import window as window_module

        call_command("migrate", verbosity=0)
        t0 = time.perf_counter()
        _seed([(h[-window:], a, s) for h, a, s in keys])
        seed_s = time.perf_counter() - t0
        rows = DemandBucket.objects.count()
        now = datetime.now(UTC)
        out: dict = {"keys": len(keys), "bucket_rows": rows, "seed_seconds": round(seed_s, 1)}
        load0 = os.getloadavg()[0]
        window_module.reset_windows()
        t0 = time.perf_counter()
        cold = tick.forecast_tick(horizon_s, now=now)
        out["cold"] = {**cold, "seconds": round(time.perf_counter() - t0, 2)}
        # One bucket later: every key's next window arrives (the held-back actuals' first).
        later = now + timedelta(seconds=BUCKET_S)
        start = datetime.fromtimestamp(now.timestamp() // BUCKET_S * BUCKET_S, tz=UTC)
        ids = list(WorkloadKey.objects.order_by("pk").values_list("pk", flat=True))
        DemandBucket.objects.bulk_create(
            [
                DemandBucket(key_id=k, start=start, seconds=BUCKET_S, requests=int(round(a[0])))
                for k, (_h, a, _s) in zip(ids, keys, strict=True)
                if a[0] > 0
            ],
            batch_size=5000,
        )
        WorkloadKey.objects.update(last_seen=later)
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
        t0 = time.perf_counter()
        warm = tick.forecast_tick(horizon_s, now=later)
        out["incremental"] = {**warm, "seconds": round(time.perf_counter() - t0, 2)}
        out["forecasts_stored"] = Forecast.objects.count()
        # Baseline in the same run: the bare COPY of the rows each tick read (bytes only, no
        # parsing, no forecasting), the database's own floor for the read stage.
        end = later.timestamp() // BUCKET_S * BUCKET_S
        for name, since in (
            ("cold_read", end - window * BUCKET_S),
            ("incremental_read", end - (1 + window_module.REREAD_BUCKETS) * BUCKET_S),
        ):
            t0 = time.perf_counter()
            n = 0
            with (
                connection.cursor() as cur,
                cur.cursor.copy(
                    "COPY (SELECT key_id, start, requests FROM demand_demandbucket WHERE seconds = %s "
                    "AND start >= to_timestamp(%s) AND start < to_timestamp(%s)) TO STDOUT",
                    (BUCKET_S, since, end),
                ) as copy,
            ):
                for block in copy:
                    n += len(block)
            out[f"baseline_bare_copy_{name}_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        out["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return out
