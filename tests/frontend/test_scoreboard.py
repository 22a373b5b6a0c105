"""Scoreboard figures and the recommendation, from SpeculativeReplica rows."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.models import Engine, Node
from controlplane.replication.models import PlanItem, Policy, ReplicationPlan, SpeculativeReplica
from controlplane.replication.scoreboard import MIN_SCORED_FOR_VERDICT, scoreboard

M_KEYS = {
    "replicas",
    "hits",
    "hits_basis",
    "hits_measured_replicas",
    "precision",
    "bytes_moved",
    "vram_byte_seconds",
    "host_byte_seconds",
    "ttft_saved_s",
}


@pytest.fixture
def engine(db):
    return Engine.objects.create(node=Node.objects.create(name="n"), engine_id="e")


def place(engine, n, tenant, hits, shadow=False, forecaster="ewma", item=None, scored=True):
    key, _ = WorkloadKey.objects.get_or_create(tenant=tenant, model="m", prefix_group="*")
    now = timezone.now()
    for _ in range(n):
        SpeculativeReplica.objects.create(
            engine=engine,
            workload_key=key,
            prefix_keys=["01"],
            bytes=100,
            bytes_moved=100,
            shadow=shadow,
            forecaster=forecaster,
            placed_at=now - timedelta(hours=1),
            expires_at=now,
            hits=hits,
            ttft_saved_s=0.5 * hits,
            vram_byte_seconds=1000.0,
            scored_at=now if scored else None,
            item=item,
        )


def test_shape_and_figures(engine):
    policy = Policy.objects.create(name="p")
    plan = ReplicationPlan.objects.create(policy=policy, mode="shadow")
    item = PlanItem.objects.create(
        plan=plan,
        prefix_keys=["01"],
        target=engine,
        bytes=100,
        expected_ttft_saved_s=1,
        cost_s=1,
        confidence=1,
        reason="r",
    )
    place(engine, 3, "acme", hits=2)
    place(engine, 1, "acme", hits=0)
    place(engine, 2, "globex", hits=0, shadow=True, forecaster="prophet", item=item)
    place(engine, 1, "globex", hits=0, scored=False)
    board = scoreboard()
    assert set(board) == {
        "window",
        "totals",
        "shadow_totals",
        "by_policy",
        "by_forecaster",
        "by_tenant",
        "recommendation",
    }
    assert set(board["totals"]) == M_KEYS
    assert board["totals"] == {
        "replicas": 5,
        "hits": 6,
        "hits_basis": "estimated",
        "hits_measured_replicas": 0,
        "precision": 0.75,
        "bytes_moved": 500,
        "vram_byte_seconds": 5000.0,
        "host_byte_seconds": 0.0,
        "ttft_saved_s": 3.0,
    }
    assert board["shadow_totals"]["precision"] == 0.0 and board["shadow_totals"]["replicas"] == 2
    assert {t["tenant"]: t["precision"] for t in board["by_tenant"]} == {
        "acme": 0.75,
        "globex": 0.0,
    }
    assert {p["policy"]: p["mode"] for p in board["by_policy"]} == {"(none)": None, "p": "shadow"}
    assert {f["forecaster"] for f in board["by_forecaster"]} == {"ewma", "prophet"}
    assert board["recommendation"]["verdict"] == "insufficient_data"


def test_verdicts(engine):
    place(engine, MIN_SCORED_FOR_VERDICT, "acme", hits=3)
    place(engine, MIN_SCORED_FOR_VERDICT, "globex", hits=0)
    rec = scoreboard()["recommendation"]
    assert rec["verdict"] == "speculation_pays" and rec["tenants_that_benefit"] == ["acme"]
    SpeculativeReplica.objects.filter(workload_key__tenant="acme").update(hits=0, ttft_saved_s=0)
    assert scoreboard()["recommendation"]["verdict"] == "reactive_enough"


def test_window_excludes_old_replicas(engine):
    place(engine, 2, "acme", hits=1)
    now = timezone.now()
    assert scoreboard(now - timedelta(minutes=10), now)["totals"]["replicas"] == 0
