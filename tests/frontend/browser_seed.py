"""Seed the browser tests' database (run as a subprocess against the live server's SQLite file).

Stage `base`: users of each role, a manual-mode policy, hot prefixes, an enrolment -> agent token.
Stage `plans`: after the agent's first report created the engines: a plan, jobs, replicas,
a forecast and an override, so every page has something to show. Prints what the tests need as JSON.
"""

import json
import os
import sys
from datetime import timedelta

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django.setup()

from django.utils import timezone  # noqa: E402

from controlplane.accounts.choices import TokenKind  # noqa: E402
from controlplane.accounts.models import ApiToken  # noqa: E402
from controlplane.demand.models import DemandBucket, WorkloadKey  # noqa: E402
from controlplane.fleet.models import Engine, GpuSample  # noqa: E402
from controlplane.forecasting.models import Forecast  # noqa: E402
from controlplane.replication.jobs.states import transition  # noqa: E402
from controlplane.replication.models import (  # noqa: E402
    Override,
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from harness import fleet_seed as cluster  # noqa: E402

TENANTS = ["acme-chat", "globex-rag", "initech-code", "umbrella-agents"]


def base() -> dict:
    for role in ("viewer", "operator", "admin"):
        cluster.make_user(role, role)
    Policy.objects.filter(active=True).update(mode="manual", max_spec_vram_fraction=0.2)
    chains = {t: cluster.chain(i + 1, 4 + i) for i, t in enumerate(TENANTS)}
    for i, (tenant, keys) in enumerate(chains.items()):
        key = cluster.hot_prefix(tenant, keys, requests=100 - 20 * i)
        now = timezone.now().replace(second=0, microsecond=0)
        for m in range(1, 120):  # two hours of demand with a ramp, for the forecast chart
            DemandBucket.objects.create(
                key=key,
                start=now - timedelta(minutes=m),
                seconds=60,
                requests=max(0, 40 - i * 5 + (m % 30) - 15),
            )
    _, token = cluster.enrol("gpu-node-01")
    _, token2 = cluster.enrol("gpu-node-02")
    _, gateway = ApiToken.issue(TokenKind.GATEWAY, "browser-gateway")
    return {"agent_token": token, "agent_token_2": token2, "chains": chains, "gateway": gateway}


def plans() -> dict:
    policy = Policy.objects.get(active=True)
    engines = list(Engine.objects.order_by("node__name", "engine_id"))
    keys = {k.tenant: k for k in WorkloadKey.objects.all()}
    plan = ReplicationPlan.objects.create(policy=policy, mode="manual")
    for i, tenant in enumerate(TENANTS[:3]):
        PlanItem.objects.create(
            plan=plan,
            workload_key=keys[tenant],
            prefix_keys=keys[tenant].prefix_keys,
            prefix_tokens=keys[tenant].prefix_tokens,
            source=engines[0],
            target=engines[-1 - i],
            bytes=len(keys[tenant].prefix_keys) * cluster.BYTES_PER_BLOCK,
            expected_ttft_saved_s=4.0 - i,
            cost_s=0.2 + i / 10,
            confidence=0.9 - i * 0.1,
            reason=f"burst risk {0.8 - i * 0.2:.0%} for {tenant} within 10 min; 1 holder of 4 engines",
        )
    now = timezone.now()
    job = ReplicationJob.objects.create(
        source=engines[0],
        target=engines[1],
        prefix_keys=keys[TENANTS[3]].prefix_keys,
        bytes=64 * cluster.BYTES_PER_BLOCK,
        bytes_done=24 * cluster.BYTES_PER_BLOCK,
    )
    for state in ("approved", "dispatched", "running"):
        job = transition(job, state, f"{state} by the seed")
    failed = ReplicationJob.objects.create(
        target=engines[2], prefix_keys=keys[TENANTS[1]].prefix_keys, bytes=10
    )
    for state in ("approved", "dispatched", "failed"):
        failed = transition(failed, state, "connection reset by peer" if state == "failed" else "")
    ReplicationJob.objects.filter(pk=failed.pk).update(
        error="tcp transfer: connection reset by peer after 3 MiB"
    )
    for engine in engines:
        for n in range(6):
            SpeculativeReplica.objects.create(
                engine=engine,
                workload_key=keys[TENANTS[n % 4]],
                prefix_keys=keys[TENANTS[n % 4]].prefix_keys,
                bytes=4 * cluster.BYTES_PER_BLOCK,
                shadow=n % 2 == 1,
                forecaster=["ewma", "prophet"][n % 2],
                placed_at=now - timedelta(hours=2),
                expires_at=now - timedelta(hours=1),
                hits=[3, 0, 1, 0, 5, 0][n],
                ttft_saved_s=[1.2, 0, 0.4, 0, 2.0, 0][n],
                vram_byte_seconds=4 * cluster.BYTES_PER_BLOCK * 3600.0,
                scored_at=now,
            )
        for gpu in engine.gpus.all():
            for m in range(60):
                GpuSample.objects.create(
                    gpu=gpu,
                    at=now - timedelta(minutes=m),
                    memory_used=(55 + (m % 10)) * cluster.GIB,
                    speculative_bytes=(m % 5) * cluster.GIB,
                    utilization_gpu=60,
                )
    key = keys[TENANTS[0]]
    Forecast.objects.create(
        key=key,
        start=now.replace(second=0, microsecond=0),
        bucket_s=60,
        horizon=30,
        yhat=[40 + i for i in range(30)],
        lower=[30 + i for i in range(30)],
        upper=[50 + i for i in range(30)],
        model="ewma",
        backtest_mase=0.82,
        scores={"ewma": 0.82, "last_value": 0.95, "seasonal_naive": 1.3},
        burst_risk=0.35,
    )
    Override.objects.create(
        kind="exclude_node", node=engines[-1].node, reason="rack r7 maintenance", active=False
    )
    return {
        "plan": plan.pk,
        "items": list(plan.items.values_list("pk", flat=True)),
        "policy": policy.pk,
        "engines": [e.pk for e in engines],
    }


def long_names() -> dict:
    """A workload key named as deployments name them (a Hugging Face model id, a long tenant),
    with a forecast whose chosen model has the longest candidate name: the widest key row."""
    key = cluster.hot_prefix(
        "servegen-language-m-large-tenant-0417", cluster.chain(9, 3), requests=1
    )
    WorkloadKey.objects.filter(pk=key.pk).update(model="meta-llama/Llama-3.1-70B-Instruct")
    now = timezone.now().replace(second=0, microsecond=0)
    Forecast.objects.create(
        key=key,
        start=now,
        bucket_s=60,
        horizon=30,
        yhat=[4.0] * 30,
        lower=[2.0] * 30,
        upper=[6.0] * 30,
        model="seasonal_naive",
        backtest_mase=12.345,
        scores={"seasonal_naive": 12.345, "ewma": 13.5},
        burst_risk=0.125,
    )
    return {"key": key.pk}


if __name__ == "__main__":
    print(json.dumps({"base": base, "plans": plans, "long_names": long_names}[sys.argv[1]]()))
