"""Evidence through the API: prefixes gateways send, plans approved by an operator, agents'
job events and KV-event reports, gateways' served-request records. Nothing in the control plane
is patched; the tests read what scoring and the verdict make of it."""

from __future__ import annotations

import time

from django.utils import timezone

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.models import Engine
from controlplane.replication.models import (
    HoldoutDraw,
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from harness import burst
from tests.workflow.conftest import BYTES_PER_BLOCK, engine_report
from wire import blockhash

BLOCKS = 64  # 1,024 tokens: one prefix group
TOKENS = BLOCKS * burst.BLOCK


def prefix(i: int) -> list[int]:
    return blockhash.chain_keys([(11 * i + 5 * t + 1) % 32000 for t in range(TOKENS)], burst.BLOCK)


class Evidence:
    """Drives a ``tests.workflow.conftest.Fleet``: node-a holds the prefixes, node-b and node-c
    are the targets."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.seq = {name: 1 for name in fleet.nodes}
        self.held: dict[str, list[int]] = {name: [] for name in fleet.nodes}
        self.engine = {
            name: Engine.objects.get(node_id=node_id) for name, node_id in fleet.nodes.items()
        }

    def report(self, name: str, keys=()) -> None:
        """``name``'s engine now also holds ``keys`` (its agent's next snapshot)."""
        self.held[name] = list(dict.fromkeys([*self.held[name], *keys]))
        self.seq[name] += 1
        r = self.fleet.agents[name].post(
            "/api/agents/report/",
            engine_report(self.seq[name], name, self.held[name]),
            format="json",
        )
        assert r.status_code == 200, r.content

    def key(self, i: int, tenant: str | None = None) -> WorkloadKey:
        """Gateways send two requests sharing prefix ``i``: its workload key."""
        chain = prefix(i)
        tenant = tenant or f"tenant-{i}"
        now = time.time()
        records = [
            {
                "time": now - 1,
                "tenant": tenant,
                "model": burst.MODEL,
                "block_size": burst.BLOCK,
                "keys": [
                    blockhash.to_hex(k)
                    for k in (*chain, blockhash.block_key(chain[-1], [j] * burst.BLOCK))
                ],
                "prompt_tokens": TOKENS + burst.BLOCK,
            }
            for j in (1, 2)
        ]
        r = self.fleet.gateway.post("/api/request-records/", {"records": records}, format="json")
        assert r.status_code == 200, r.content
        # A tenant may send several prefixes: its key of this one is the one whose chain it is.
        hexes = [blockhash.to_hex(k) for k in chain]
        (key,) = (
            k
            for k in WorkloadKey.objects.filter(tenant=tenant, model=burst.MODEL)
            if list(k.prefix_keys) == hexes
        )
        return key

    def plan(self, policy: Policy, moves: list[tuple[WorkloadKey, str]]) -> ReplicationPlan:
        """A proposed plan copying each key's prefix from node-a to the named node (the planner's
        output shape; which items it picks is not under test here)."""
        plan = ReplicationPlan.objects.create(policy=policy, mode=policy.mode)
        for key, target in moves:
            PlanItem.objects.create(
                plan=plan,
                workload_key=key,
                prefix_keys=list(key.prefix_keys),
                prefix_tokens=key.prefix_tokens,
                source=self.engine["node-a"],
                target=self.engine[target],
                bytes=len(key.prefix_keys) * BYTES_PER_BLOCK,
                expected_ttft_saved_s=1.0,
                cost_s=0.01,
                confidence=1.0,
                reason="test",
            )
        return plan

    def approve(self, plan: ReplicationPlan) -> dict:
        r = self.fleet.operator.post(f"/api/plans/{plan.pk}/approve/", {}, format="json")
        assert r.status_code == 200, r.content
        return r.json()

    def land(self, job: ReplicationJob, cut: bool = False) -> ReplicationJob:
        """Both agents report the copy done (ack, then result), as real agents do; ``cut``: the
        target's ack names its latest report (``report_seq``), as the real agent's does."""
        names = {v: k for k, v in self.fleet.nodes.items()}
        for engine in (job.source, job.target):
            name = names[engine.node_id]
            agent = self.fleet.agents[name]
            ack: dict = {"type": "job.ack", "job_id": str(job.pk)}
            if cut and engine == job.target:
                ack["report_seq"] = self.seq[name]
            for msg in (
                ack,
                {
                    "type": "job.result",
                    "job_id": str(job.pk),
                    "state": "succeeded",
                    "checksum": "ab" * 32,
                    "bytes": job.bytes,
                    "error": None,
                },
            ):
                r = agent.post(f"/api/agents/jobs/{job.pk}/events/", msg, format="json")
                assert r.status_code == 200, r.content
        job.refresh_from_db()
        return job

    def served(
        self, key: WorkloadKey, target: str, n: int, cached: int, ttft_s=None, by_agent=False
    ) -> None:
        """Gateways' records (``by_agent``: the request tap's of ``target``'s own agent, as behind
        a router) of ``n`` requests of ``key`` served by ``target``'s engine, all after
        this moment and after every hold begun so far (a replica counts requests from its
        placement on: a record dated before a copy that landed a millisecond ago, or before a
        held-out copy would have landed, is rightly not its; nor is one before an assignment's
        window opens)."""
        last = SpeculativeReplica.objects.order_by("-placed_at").values_list("placed_at", flat=True)
        opened = HoldoutDraw.objects.filter(window_start__isnull=False).order_by("-window_start")
        starts = [*last[:1], *opened.values_list("window_start", flat=True)[:1]]
        now = max([time.time(), *(t.timestamp() + 0.001 for t in starts)])
        chain = [blockhash.from_hex(k) for k in key.prefix_keys]
        records = []
        for j in range(n):
            rec = {
                "time": now + 0.001 * j,
                "tenant": key.tenant,
                "model": key.model,
                "block_size": burst.BLOCK,
                "keys": [
                    blockhash.to_hex(k)
                    for k in (*chain, blockhash.block_key(chain[-1], [100 + j] * burst.BLOCK))
                ],
                "prompt_tokens": TOKENS + burst.BLOCK,
                "engine": f"{target}/vllm-0",
                "cached_tokens": cached,
            }
            if ttft_s is not None:
                rec["ttft_s"] = ttft_s(j) if callable(ttft_s) else ttft_s
            records.append(rec)
        poster = self.fleet.agents[target] if by_agent else self.fleet.gateway
        r = poster.post("/api/request-records/", {"records": records}, format="json")
        assert r.status_code == 200, r.content


def since() -> str:
    return (timezone.now().replace(year=2000)).isoformat().replace("+00:00", "Z")


def confirmed_copy(ev: Evidence, policy: Policy, key: WorkloadKey, target: str) -> ReplicationJob:
    """Plan, approve, land and confirm (the target's KV events) one copy of ``key``."""
    plan = ev.plan(policy, [(key, target)])
    assert ev.approve(plan)["refused"] == {}
    job = ev.land(ReplicationJob.objects.get(item__plan=plan))
    ev.report(target, [blockhash.from_hex(k) for k in key.prefix_keys])
    job.refresh_from_db()
    assert job.state == "confirmed", job.state
    return job


def held_out_pair(ev: Evidence, policy: Policy, key: WorkloadKey, target: str) -> None:
    """Approve one item under a policy that holds every item out."""
    plan = ev.plan(policy, [(key, target)])
    assert ev.approve(plan)["refused"] == {}
    assert plan.items.get().decision == "held_out"


def set_holdout(fleet, policy: Policy, fraction: float) -> None:
    r = fleet.admin.patch(
        f"/api/policies/{policy.pk}/", {"holdout_fraction": fraction}, format="json"
    )
    assert r.status_code == 200, r.content
    policy.refresh_from_db()
