"""A plan item approved as an operator approves it in the dashboard becomes an ``lmcache`` job;
the target agent's executor runs it against the real LMCache controller and engines; the copy
keeps the source, the pin on the target confirms it, a renewal keeps it confirmed and a renewal
that finds it gone marks it lost. The control plane runs in-process (tasks eager)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.models import Engine, Node
from controlplane.replication.jobs.delivery import apply_event
from controlplane.replication.jobs.messages import assign_message
from controlplane.replication.models import (
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from controlplane.replication.tasks import evict_expired
from nodeagent.blockstore import MemoryBlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job
from nodeagent.transfers.lmcache import LmcacheController, LmcacheTransport
from tests.api.conftest import make_user
from tests.lmcache.conftest import tokens
from tests.workflow.conftest import eager  # noqa: F401 - the fixture
from wire import blockhash

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]
BLOCK, BPB = 16, 16 * 4096
WHOLE = tokens(20_000, 20_512)  # two whole 256-token LMCache chunks
# 600 tokens: LMCache holds whole chunks only, so 512 arrive. The executor's own count (512
# copied) is not what the control plane judges by: the plan asked for 600, the copy is partial.
SHORT = tokens(30_000, 30_600)


def engine(name: str, instance: str) -> Engine:
    node = Node.objects.create(name=name)
    return Engine.objects.create(
        node=node,
        engine_id="vllm-0",
        model="llama3-8b",
        block_size=BLOCK,
        bytes_per_block=BPB,
        kv_capacity_blocks=100_000,
        endpoints={"lmcache_instance_id": instance, "lmcache_location": "LocalCPUBackend"},
    )


def approved_copy(c, tmp_path, TOKENS):  # noqa: N803
    """An operator approves a plan item copying ``TOKENS`` from A to B; the target agent's
    executor runs the job it is sent and its result is applied. Returns (job, executor, src,
    tgt)."""
    c.store("A", TOKENS[0], TOKENS[-1] + 1)
    for role in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=role)
    src, tgt = engine("node-a", "A"), engine("node-b", "B")
    chain = [blockhash.to_hex(k) for k in blockhash.chain_keys(TOKENS, BLOCK)]
    key = WorkloadKey.objects.create(
        tenant="acme",
        model="llama3-8b",
        prefix_group=chain[0],
        prefix_keys=chain,
        prefix_tokens=len(TOKENS),
        prefix_token_ids=TOKENS,
    )
    Policy.objects.update(active=False)
    policy = Policy.objects.create(
        name="p",
        active=True,
        mode="manual",
        default_transport="lmcache",
        max_spec_vram_fraction=0.5,
        min_confidence=0.0,
    )
    plan = ReplicationPlan.objects.create(policy=policy, mode="manual")
    PlanItem.objects.create(
        plan=plan,
        workload_key=key,
        prefix_keys=chain,
        prefix_tokens=len(TOKENS),
        source=src,
        target=tgt,
        bytes=len(chain) * BPB,
        expected_ttft_saved_s=1.0,
        cost_s=0.1,
        confidence=0.9,
        reason="test",
    )
    operator = APIClient()
    operator.force_authenticate(make_user("operator", "op"))
    r = operator.post(f"/api/plans/{plan.pk}/approve/", {}, format="json")
    assert r.status_code == 200 and r.json()["refused"] == {}, r.content
    job = ReplicationJob.objects.get()
    assert job.state == "dispatched" and job.transport == "lmcache" and job.tier == "CPU"
    # The target agent's executor, from the job.assign the control plane sends it.
    msg = assign_message(job, "target")["job"]
    asked = len(TOKENS) // BLOCK * BLOCK  # the chain's whole blocks
    assert msg["tokens"] == TOKENS[:asked] and msg["lmcache"]["source_instance"] == "A"
    ex = LmcacheTransport(
        {
            "vllm-0": EngineConfig(
                engine_id="vllm-0", kv_events="tcp://127.0.0.1:1", lmcache_instance_id="B"
            )
        },
        c.url,
        1.0,  # renew every second: the keeper's next round reads the controller again
        tmp_path / "l.json",
    )
    result = ex.receive(Job.from_message(msg), MemoryBlockStore(1), lambda n: None)
    assert result.ok, result.error
    run_on_agent(tgt, job, result)
    job.refresh_from_db()
    return job, ex, src, tgt


def run_on_agent(tgt: Engine, job: ReplicationJob, result) -> None:
    """The target's agent acknowledges the job and reports its executor's result."""
    apply_event(tgt.node_id, {"type": "job.ack", "job_id": str(job.pk)})
    apply_event(
        tgt.node_id,
        {
            **result.extra,
            "type": "job.result",
            "job_id": str(job.pk),
            "state": "succeeded" if result.ok else "failed",
            "checksum": None,
            "bytes": result.bytes,
            "error": result.error,
        },
    )


@pytest.mark.parametrize(("TOKENS", "outcome"), [(WHOLE, "confirmed"), (SHORT, "partial")])
def test_an_approved_plan_item_becomes_a_copy_judged_by_the_pin(
    lmcache_cluster,
    transactional_db,
    eager,  # noqa: F811
    tmp_path,
    TOKENS,  # noqa: N803
    outcome,
):
    c = lmcache_cluster
    a_before = c.key_count("A") + len(TOKENS) // 256
    job, ex, _, tgt = approved_copy(c, tmp_path, TOKENS)
    replica = job.replicas.get()
    assert job.state == outcome and replica.confirmed_by == "lmcache-pin" and replica.tier == "CPU"
    assert replica.tokens == 512 and replica.new_tokens == 512  # what the target shows
    assert replica.bytes_moved == 512 // BLOCK * BPB
    assert c.key_count("A") == a_before  # a copy, not a move
    # The lease keeper's real readings (pins on the controller) come back as job.confirm
    # events and keep the copy confirmed.
    readings = ex.leases.renew_due(now=time.time() + 2)
    assert readings and all(r["tokens"] == 512 and r["error"] is None for r in readings)
    for reading in readings:
        assert apply_event(tgt.node_id, reading).state == outcome
    # The copy leaves the target before its hold ends (LMCache 0.5.6 never frees copied chunks
    # by itself, tests/lmcache/test_controller.py: here they are moved off it through the
    # controller): the keeper's next real reading has fewer tokens than the copy covers, a loss.
    held = ex.leases.leases[str(job.pk)].tokens
    LmcacheController(c.url).move(
        ("B", "LocalCPUBackend"), ("A", "LocalCPUBackend"), held, copy=False
    )
    gone = ex.leases.renew_due(now=time.time() + 4)
    assert gone and gone[0]["tokens"] == 0, gone
    assert apply_event(tgt.node_id, gone[0]).state == "lost"
    replica.refresh_from_db()
    assert replica.lost_at is not None


def test_the_hold_ends_and_the_evict_job_takes_the_copy_off_the_target(
    lmcache_cluster,
    transactional_db,
    eager,  # noqa: F811
    tmp_path,
):
    """LMCache 0.5.6 never frees a copy by itself, lapsed lease or not
    (tests/lmcache/test_controller.py): past its hold the control plane sends the target's
    agent an evict job naming the source, the executor moves the chunks back there, and the
    replica ends once the target holds none of them."""
    from nodeagent.jobs import JobRunner, Journal

    c = lmcache_cluster
    toks = tokens(60_000, 60_512)
    b_before = c.key_count("B")
    job, ex, src, tgt = approved_copy(c, tmp_path, toks)
    replica = job.replicas.get()
    assert job.state == "confirmed" and c.key_count("B") == b_before + 2
    SpeculativeReplica.objects.filter(pk=replica.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    evict_expired.delay()
    evict = ReplicationJob.objects.get(action="evict")
    assert evict.state == "dispatched" and evict.target == tgt and evict.source == src
    msg = assign_message(evict, "target")["job"]
    assert msg["tokens"] == toks and msg["lmcache"]["source_instance"] == "A"
    runner = JobRunner(Journal(tmp_path / "journal"), MemoryBlockStore(1), {"lmcache": ex})
    result = runner._execute(Job.from_message(msg), lambda n: None)
    run_on_agent(tgt, evict, result)
    evict.refresh_from_db()
    replica.refresh_from_db()
    assert evict.state == "succeeded", (evict.state, evict.error)
    assert replica.evicted_at is not None
    assert c.key_count("B") == b_before
    assert LmcacheController(c.url).pin("B", "LocalCPUBackend", toks) == 0
    assert not ex.leases.leases  # nothing left to renew
