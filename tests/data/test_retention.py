"""Retention: a simulated week of 64 agents' telemetry and gateway demand stays within the bound
stated in docs/reliability.md, and each roll-up keeps what its readers need."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Sum

from controlplane.audit.models import AuditEvent
from controlplane.audit.services import prune_audit
from controlplane.demand.models import DemandBucket, WorkloadKey
from controlplane.demand.services import downsample_demand
from controlplane.fleet.models import Gpu, GpuSample, Node
from controlplane.fleet.retention import downsample_gpu_samples
from controlplane.forecasting.models import Forecast
from controlplane.forecasting.services.storage import prune_forecasts
from controlplane.replication.models import JobTransition, Policy, ReplicationJob, ReplicationPlan
from controlplane.replication.services import prune_finished

AGENTS, GPUS_PER_AGENT, KEYS = 64, 1, 64
START = datetime(2026, 3, 2, tzinfo=UTC)
DAY = timedelta(days=1)
# The bound docs/reliability.md states for this week (SQLite pages in use, all tables).
WEEK_BOUND_BYTES = 160 * 2**20


def _insert(table: str, columns: list[str], rows: list[tuple]) -> None:
    adapt = connection.ops.adapt_datetimefield_value
    rows = [tuple(adapt(v) if isinstance(v, datetime) else v for v in r) for r in rows]
    sql = (
        f'INSERT INTO "{table}" ({", ".join(columns)}) VALUES ({", ".join(["%s"] * len(columns))})'
    )
    with connection.cursor() as cur:
        cur.executemany(sql, rows)


def _live_bytes() -> int:
    """Bytes the live rows take: SQLite pages in use; on PostgreSQL the live tuples of every table
    (dead tuples wait for VACUUM, which cannot run inside the test's transaction)."""
    if connection.vendor == "postgresql":
        total = 0
        with connection.cursor() as cur:
            for table in connection.introspection.table_names(cur):
                cur.execute(f'SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM "{table}" t')
                total += int(cur.fetchone()[0])
        return total
    with connection.cursor() as cur:
        size = cur.execute("PRAGMA page_size").fetchone()[0]
        pages = cur.execute("PRAGMA page_count").fetchone()[0]
        free = cur.execute("PRAGMA freelist_count").fetchone()[0]
    return (pages - free) * size


def _simulate_day(day: int, gpus: list[int], keys: list[int], policy: Policy) -> int:
    t0 = START + day * DAY
    minutes = [t0 + timedelta(minutes=m) for m in range(1440)]
    _insert(
        "fleet_gpusample",
        ["gpu_id", "at", "memory_used", "kv_bytes", "speculative_bytes", "utilization_gpu"],
        [(g, at, 60 << 30, 40 << 30, 1 << 30, 80.0) for g in gpus for at in minutes],
    )
    _insert(
        "demand_demandbucket",
        [
            "key_id",
            "start",
            "seconds",
            "requests",
            "prompt_tokens",
            "cached_tokens",
            "served_records",
            "gateway_requests",
            "gateway_served_records",
        ],
        [
            (k, at, 60, n, 4000, 1000, 3, n, 3)  # a gateway's records, every one
            for k in keys
            for i, at in enumerate(minutes)
            for n in [3 + (k + i) % 7]
        ],
    )
    band = json.dumps([1.0] * 10)
    _insert(
        "forecasting_forecast",
        [
            "key_id",
            "generated_at",
            "start",
            "bucket_seconds",
            "horizon",
            "yhat",
            "lower",
            "upper",
            "model",
            "scores",
            "note",
        ],
        [
            (k, at, at, 60, 10, band, band, band, "seasonal_naive", "{}", "")
            for k in keys
            for at in minutes[::10]
        ],
    )
    _insert(
        "audit_auditevent",
        ["at", "actor_label", "action", "object_type", "object_id", "reason"],
        [(at, "system", "node.stale", "fleet.node", "1", "") for at in minutes[::10]],
    )
    plan = ReplicationPlan.objects.create(policy=policy, mode="auto", state="approved")
    ReplicationPlan.objects.filter(pk=plan.pk).update(created_at=t0)
    for i in range(100):
        job = ReplicationJob.objects.create(prefix_keys=["01"], bytes=1, state="succeeded")
        ReplicationJob.objects.filter(pk=job.pk).update(updated_at=t0 + timedelta(minutes=i))
        JobTransition.objects.bulk_create(
            [
                JobTransition(job=job, from_state=a, to_state=b)
                for a, b in [
                    ("pending", "approved"),
                    ("approved", "dispatched"),
                    ("dispatched", "running"),
                    ("running", "succeeded"),
                ]
            ]
        )
    return len(gpus) * 1440


@pytest.mark.slow
def test_a_simulated_week_stays_within_the_stated_bound(db, settings):
    settings.PREWARM_JOB_KEEP_DAYS = 3  # short, so the week exercises the job pruning too
    settings.PREWARM_AUDIT_KEEP_DAYS = 5
    nodes = Node.objects.bulk_create([Node(name=f"n{i}") for i in range(AGENTS)])
    gpus = [
        g.pk
        for g in Gpu.objects.bulk_create(
            [
                Gpu(node=n, uuid=f"GPU-{n.name}-{j}", index=j)
                for n in nodes
                for j in range(GPUS_PER_AGENT)
            ]
        )
    ]
    keys = [
        k.pk
        for k in WorkloadKey.objects.bulk_create(
            [
                WorkloadKey(tenant=f"t{i // 8}", model="m", prefix_group=f"{i:016x}")
                for i in range(KEYS)
            ]
        )
    ]
    policy = Policy.objects.get(active=True)
    requests_sent = 0
    for day in range(7):
        _simulate_day(day, gpus, keys, policy)
        requests_sent = DemandBucket.objects.aggregate(n=Sum("requests"))["n"]
        now = START + (day + 1) * DAY
        for prune in (
            downsample_gpu_samples,
            downsample_demand,
            prune_forecasts,
            prune_finished,
            prune_audit,
        ):
            prune(now)

    n_gpus = AGENTS * GPUS_PER_AGENT
    # GPU samples: the last 24 h at one a minute, the 6 days before at one an hour.
    assert GpuSample.objects.count() == n_gpus * (24 * 60 + 6 * 24)
    assert (
        GpuSample.objects.filter(at__lt=START + 6 * DAY).values("gpu", "at").count()
        == n_gpus * 6 * 24
    )
    # Demand: the forecaster reads 14 days of fine buckets, so a week keeps them all, with every request.
    assert DemandBucket.objects.count() == KEYS * 7 * 1440
    assert DemandBucket.objects.aggregate(n=Sum("requests"))["n"] == requests_sent
    # Forecasts: the last 24 h (one per key every 10 min), plus each key's latest.
    assert Forecast.objects.count() <= KEYS * 145
    assert ReplicationJob.objects.count() == 3 * 100 and JobTransition.objects.count() == 3 * 400
    assert not AuditEvent.objects.filter(at__lt=START + 2 * DAY).exists()
    assert AuditEvent.objects.filter(action="audit.pruned").exists()
    size = _live_bytes()
    print(
        f"\nweek of {AGENTS} agents x {GPUS_PER_AGENT} GPU, {KEYS} workload keys: "
        f"{size / 2**20:.1f} MiB in use; gpu samples {GpuSample.objects.count():,}, "
        f"demand buckets {DemandBucket.objects.count():,}, forecasts {Forecast.objects.count():,}"
    )
    assert size <= WEEK_BOUND_BYTES


def test_demand_roll_up_keeps_every_request_and_is_idempotent(db, settings):
    settings.PREWARM_DEMAND_FINE_DAYS = 1
    key = WorkloadKey.objects.create(tenant="t", model="m", prefix_group="*")
    DemandBucket.objects.bulk_create(
        [
            DemandBucket(
                key=key,
                start=START + timedelta(minutes=m),
                seconds=60,
                requests=m % 5,
                prompt_tokens=10,
                cached_tokens=1,
            )
            for m in range(3 * 1440)
        ]
    )
    total = DemandBucket.objects.aggregate(n=Sum("requests"))["n"]
    now = START + 3 * DAY
    downsample_demand(now)
    downsample_demand(now)
    assert DemandBucket.objects.aggregate(n=Sum("requests"))["n"] == total
    assert DemandBucket.objects.filter(seconds=3600).count() == 48
    assert DemandBucket.objects.filter(seconds=60).count() == 1440


def test_miss_roll_up_keeps_every_reason_count_and_is_idempotent(db, settings):
    from controlplane.demand.models import MissBucket
    from controlplane.fleet.models import Engine

    settings.PREWARM_DEMAND_FINE_DAYS = 1
    key = WorkloadKey.objects.create(tenant="t", model="m", prefix_group="*")
    engine = Engine.objects.create(node=Node.objects.create(name="n"), engine_id="e")
    MissBucket.objects.bulk_create(
        [
            MissBucket(
                key=key,
                engine=engine,
                start=START + timedelta(minutes=m),
                seconds=60,
                hit=m % 5,
                cold=m % 2,
                sol_hits=m % 5 + m % 2,
            )
            for m in range(3 * 1440)
        ]
    )
    sums = {"hit": Sum("hit"), "cold": Sum("cold"), "sol": Sum("sol_hits")}
    total = MissBucket.objects.aggregate(**sums)
    downsample_demand(START + 3 * DAY)
    downsample_demand(START + 3 * DAY)
    assert MissBucket.objects.aggregate(**sums) == total
    assert MissBucket.objects.filter(seconds=3600).count() == 48
    assert MissBucket.objects.filter(seconds=60).count() == 1440


def test_gpu_roll_up_averages_each_hour(db, settings):
    node = Node.objects.create(name="n")
    gpu = Gpu.objects.create(node=node, uuid="GPU-1", index=0)
    GpuSample.objects.bulk_create(
        [
            GpuSample(
                gpu=gpu, at=START + timedelta(minutes=m), memory_used=m, utilization_gpu=float(m)
            )
            for m in range(120)
        ]
    )
    downsample_gpu_samples(START + 3 * DAY)
    rows = list(GpuSample.objects.order_by("at").values_list("at", "memory_used"))
    assert rows == [
        (START, math.floor(59 / 2)),
        (START + timedelta(hours=1), math.floor((60 + 119) / 2)),
    ]
