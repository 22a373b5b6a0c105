"""The forecast -> plan cycle through real Celery worker processes (``bench/forecast.py --celery``).

PostgreSQL + Redis (``PREWARM_BENCH_PG_URL``, ``PREWARM_BENCH_REDIS_URL``). The keys are the
forecast benchmark's (ServeGen m-large tenants x origins, 10-minute buckets), written as workload
keys with their demand buckets ending now. For each worker count, ``celery -A controlplane.celery
worker -Q forecast,plan -c 1`` processes are started (``nice -n 10`` unless told otherwise), the
cycle is sent as ``tick`` sends it
(``forecast_all | plan_after_forecasts``), and the time from sending it to the plan step having
run is measured, with every key's forecast stored. Forecasts are deleted between runs.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory

REPO = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("PREWARM_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/prewarm_bench")
REDIS_URL = os.environ.get("PREWARM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
BUCKET_S = 600


def _env(data_dir: str) -> dict[str, str]:
    """The environment of a run on PREWARM_BENCH_PG_URL's database, created there when missing
    (``DatabaseUnavailable``, one line, when the server does not answer)."""
    from harness.processes import ensure_database

    ensure_database(PG_URL)
    return {
        "DATABASE_URL": PG_URL,
        "REDIS_URL": REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "SECRET_KEY": "bench-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "PREWARM_SECURE": "false",
        "PREWARM_DATA_DIR": data_dir,
        "PREWARM_DEMAND_BUCKET_SECONDS": str(BUCKET_S),
        "PREWARM_FORECAST_HISTORY_DAYS": "14",
        "LOG_LEVEL": "WARNING",
    }


def _seed(keys) -> int:
    """Workload keys and their demand buckets (history ending at the current bucket)."""
    from django.db import connection

    from controlplane.demand.models import DemandBucket, WorkloadKey
    from controlplane.forecasting.models import Forecast

    Forecast.objects.all().delete()
    DemandBucket.objects.all().delete()
    WorkloadKey.objects.all().delete()
    now = datetime.now(UTC)
    end = now.timestamp() // BUCKET_S * BUCKET_S
    made = WorkloadKey.objects.bulk_create(
        [
            WorkloadKey(
                tenant=f"bench-{i}", model="llama3-70b", prefix_group=f"{i:016x}", last_seen=now
            )
            for i in range(len(keys))
        ]
    )
    table = DemandBucket._meta.db_table
    with (
        connection.cursor() as cur,
        cur.cursor.copy(
            f"COPY {table} (key_id, start, seconds, requests, prompt_tokens, cached_tokens, "
            "served_records) FROM STDIN"
        ) as copy,
    ):
        for wk, (history, _actual, _start) in zip(made, keys, strict=True):
            first = end - len(history) * BUCKET_S
            for j, count in enumerate(history):
                if count > 0:
                    copy.write_row(
                        (
                            wk.pk,
                            datetime.fromtimestamp(first + j * BUCKET_S, UTC),
                            BUCKET_S,
                            int(round(count)),
                            0,
                            0,
                            0,
                        )
                    )
    return sum(1 for h, _a, _s in keys if h.sum() > 0)


def _workers(n: int, env: dict, log_dir: str, nice: int) -> list:
    from harness.processes import Proc, celery_worker_argv

    argv = celery_worker_argv(
        "forecast,plan", 1, "", "INFO", "--without-mingle", "--without-gossip"
    )
    return [
        Proc(
            f"worker-{n}-{i}",
            ["nice", "-n", str(nice), *argv, "-n", f"bench{n}-{i}@%h"],
            {**os.environ, **env},
            Path(log_dir),
        ).start()
        for i in range(n)
    ]


def _wait_ready(app, n: int, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if len(app.control.ping(timeout=1.0) or []) >= n:
            return
    raise RuntimeError(f"{n} celery workers did not answer a ping within {limit_s:.0f} s")


def _plan_ran(log_dir: str, n: int) -> bool:
    return any(
        "plan_after_forecasts" in line and "succeeded" in line  # not-vocabulary: Celery's log
        for p in Path(log_dir).glob(f"worker-{n}-*.log")
        for line in p.read_text().splitlines()
    )


def _task_s(log_dir: str, n: int) -> list[float]:
    """How long each forecast_all task took, from the workers' logs."""
    pattern = re.compile(r"forecast_all\[.*\] succeeded in ([0-9.]+)s")
    return sorted(
        float(m.group(1))
        for p in Path(log_dir).glob(f"worker-{n}-*.log")
        for m in map(pattern.search, p.read_text().splitlines())
        if m
    )


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for descendants, stan included
    return usage.ru_utime + usage.ru_stime


def run(keys, worker_counts=(1, 2), limit_s: float = 1800, nice: int = 10) -> dict:
    with TemporaryDirectory() as tmp:
        env = _env(tmp)
        os.environ.update(env)
        import django

        django.setup()
        import redis
        from django.core.management import call_command

        from controlplane.celery import app
        from controlplane.forecasting.models import Forecast
        from controlplane.forecasting.tasks import forecast_all
        from controlplane.replication.tasks import plan_after_forecasts

        call_command("migrate", verbosity=0)
        t0 = time.perf_counter()
        with_demand = _seed(keys)
        seed_s = time.perf_counter() - t0
        out = {
            "keys": len(keys),
            "keys_with_demand": with_demand,
            "seed_seconds": round(seed_s, 1),
            "worker_nice": nice,
            "cpus": len(os.sched_getaffinity(0)),
            "runs": [],
        }
        for n in worker_counts:
            Forecast.objects.all().delete()
            redis.Redis.from_url(REDIS_URL).flushdb()
            cpu0 = _children_cpu_s()
            procs = _workers(n, env, tmp, nice)
            try:
                _wait_ready(app, n)
                load0 = os.getloadavg()[0]
                t0 = time.perf_counter()
                (forecast_all.si(600.0) | plan_after_forecasts.s(None)).delay()
                deadline = time.monotonic() + limit_s
                while not _plan_ran(tmp, n):
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the cycle with {n} workers did not finish in {limit_s:.0f} s"
                        )
                    time.sleep(0.2)
                elapsed = time.perf_counter() - t0
                tasks = _task_s(tmp, n)
                run_ = {
                    "worker_processes": n,
                    "cycle_seconds": round(elapsed, 1),
                    "forecasts": Forecast.objects.count(),
                    "forecast_tasks": len(tasks),
                    "task_seconds_p50": round(tasks[len(tasks) // 2], 2) if tasks else None,
                    "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
                }
                out["runs"].append(run_)
            finally:
                for p in procs:
                    p.send(signal.SIGTERM, group=False)  # each worker stops its pool
                for p in procs:
                    p.stop(30, leader_first=True)
            # CPU the worker processes (and their Stan fits) got, over the cycle: ~n cores when the
            # machine gives each process a core of its own, less when other work takes them.
            run_["worker_cpu_seconds"] = round(_children_cpu_s() - cpu0, 1)
            run_["cores_used"] = round(run_["worker_cpu_seconds"] / elapsed, 2)
            print(
                f"  {n} worker process(es): cycle {elapsed:.1f} s, {run_['forecasts']} forecasts, "
                f"forecast task p50 {run_['task_seconds_p50']} s, {run_['cores_used']} cores used, "
                f"load {run_['load_avg_1m']}",
                flush=True,
            )
        by_n = {r["worker_processes"]: r["cycle_seconds"] for r in out["runs"]}
        if 1 in by_n and 2 in by_n:
            out["speedup_2_vs_1"] = round(by_n[1] / by_n[2], 2)
    return out
