"""An agent is only ever itself: enrolment cannot take over a node, a retired node is out, a GPU
belongs to the node that reported it first, request records are plausible and bounded per node.

Each test reproduces an attack from one node's (or one fleet token's) credentials through the
real views."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from asgiref.sync import sync_to_async as in_views_thread
from channels.db import database_sync_to_async as sync_to_async
from django.db import connections
from rest_framework.test import APIClient

from controlplane.accounts.models import ApiToken, EnrolmentToken
from controlplane.accounts.services import issue_enrolment_token
from controlplane.audit.models import AuditEvent
from controlplane.demand.models import DemandBucket
from controlplane.fleet.choices import TENANTS_LABEL
from controlplane.fleet.models import Engine, Gpu, Node
from controlplane.fleet.services import rotate_agent_token
from harness.fleet_seed import gpu_doc
from nodeagent.reporter import Reporter
from tests.api.conftest import bearer
from tests.api.helpers import report


def enrol_with(raw: str, hostname: str, **proof):
    return APIClient().post(
        "/api/agents/enrol/",
        {"enrolment_token": raw, "hostname": hostname, **proof},
        format="json",
    )


def fleet_token(max_uses: int = 10, **kw) -> str:
    return issue_enrolment_token(None, max_uses=max_uses, **kw)[1]


def test_a_fleet_token_cannot_take_over_an_enrolled_node(db):
    fleet = fleet_token()
    first = enrol_with(fleet, "node-b")
    assert first.status_code == 201
    victim = bearer(first.json()["agent_token"])
    # Another pod that can read the same Secret enrols under node-b's name: refused, audited,
    # and the real agent keeps working.
    stolen = enrol_with(fleet, "node-b")
    assert stolen.status_code == 403 and stolen.json()["error"] == "node_name_taken"
    assert victim.post("/api/agents/report/", report(1), format="json").status_code == 200
    refusal = AuditEvent.objects.get(action="node.enrol_refused")
    assert refusal.object_id == str(first.json()["node_id"]) and "node-b" in str(refusal.after)
    assert ApiToken.objects.filter(node__name="node-b", revoked_at__isnull=True).count() == 1
    # A wrong secret or another node's token proves nothing.
    other = enrol_with(fleet, "node-c").json()
    assert enrol_with(fleet, "node-b", node_secret="guess").status_code == 403
    assert enrol_with(fleet, "node-b", agent_token=other["agent_token"]).status_code == 403
    assert AuditEvent.objects.filter(action="node.enrol_refused").count() == 3


def test_a_node_re_enrols_with_its_own_proof(db, client_for):
    fleet = fleet_token()
    first = enrol_with(fleet, "node-b").json()
    # Its enrolment secret (kept in the agent's state): the old token stops working.
    again = enrol_with(fleet, "node-b", node_secret=first["node_secret"])
    assert again.status_code == 201 and again.json()["node_id"] == first["node_id"]
    assert bearer(first["agent_token"]).post("/api/agents/heartbeat/", {}).status_code == 401
    # The secret is renewed at each enrolment: the old one no longer proves anything.
    assert enrol_with(fleet, "node-b", node_secret=first["node_secret"]).status_code == 403
    # Its current agent token.
    token = again.json()["agent_token"]
    assert enrol_with(fleet, "node-b", agent_token=token).status_code == 201
    # An enrolment token bound to its name (a host rebuilt without the agent's state); a bound
    # token enrols no other name.
    bound = fleet_token(max_uses=1, node_name="node-b")
    assert enrol_with(bound, "node-x").status_code == 403
    assert enrol_with(bound, "node-b").status_code == 201
    # An admin's approval in the dashboard (the API it calls).
    assert enrol_with(fleet, "node-b").status_code == 403
    node = Node.objects.get(name="node-b")
    assert (
        client_for("operator").post(f"/api/nodes/{node.pk}/allow-reenrolment/").status_code == 403
    )
    resp = client_for("admin").post(f"/api/nodes/{node.pk}/allow-reenrolment/")
    assert resp.status_code == 200 and resp.json()["reenrol_allowed_until"]
    assert AuditEvent.objects.filter(action="node.reenrolment_allowed").exists()
    assert enrol_with(fleet, "node-b").status_code == 201
    assert enrol_with(fleet, "node-b").status_code == 403  # the approval is used up
    assert Node.objects.count() == 1


def test_a_retired_node_is_out(enrol, client_for):
    node_id, agent = enrol("node-r")
    assert agent.post("/api/agents/report/", report(1), format="json").status_code == 200
    rec = {"time": 1764540000, "model": "m", "tenant": "t", "keys": ["01"], "cached_tokens": 0}
    rec["engine"] = "node-r/vllm-0"
    # Only retiring: an admin may not set a node active or stale.
    admin = client_for("admin")
    assert (
        admin.patch(f"/api/nodes/{node_id}/", {"state": "stale"}, format="json").status_code == 400
    )
    assert (
        client_for("operator")
        .patch(f"/api/nodes/{node_id}/", {"state": "retired"}, format="json")
        .status_code
        == 403
    )
    resp = admin.patch(f"/api/nodes/{node_id}/", {"state": "retired"}, format="json")
    assert resp.status_code == 200 and resp.json()["state"] == "retired"
    assert Node.objects.get(pk=node_id).state == "retired"
    assert AuditEvent.objects.filter(action="node.retired", object_id=str(node_id)).exists()
    assert not ApiToken.objects.filter(node_id=node_id, revoked_at__isnull=True).exists()
    buckets = DemandBucket.objects.count()
    assert agent.post("/api/agents/heartbeat/", {}, format="json").status_code == 401
    assert agent.post("/api/request-records/", {"records": [rec]}, format="json").status_code == 401
    assert DemandBucket.objects.count() == buckets
    engine = Engine.objects.get(node_id=node_id)
    lifecycle = agent.post(f"/api/engines/{engine.pk}/lifecycle/", {"lifecycle": "draining"})
    assert lifecycle.status_code == 401  # (the long-poll: tests/workflow/test_agent_revocation.py)
    # Its agent cannot enrol itself back with the secret it kept.
    secret_holder = fleet_token()
    assert enrol_with(secret_holder, "node-r").status_code == 403


def test_a_gpu_claimed_by_another_node_is_refused_alone_and_an_admin_reassigns_it(
    enrol, client_for
):
    _, agent_a = enrol("node-a")
    b_id, agent_b = enrol("node-b")
    # A reports B's GPU first (squatting).
    assert agent_a.post("/api/agents/report/", report(1), format="json").status_code == 200
    # B's report is applied all the same, but for that GPU.
    stored = [("00000000000000aa", None, "GPU")]
    resp = agent_b.post("/api/agents/report/", report(1, stored, mode="snapshot"), format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["gpus_refused"] == ["GPU-aaa"]
    assert Node.objects.get(pk=b_id).last_seq == 1  # its sequence moves on
    engine_b = Engine.objects.get(node_id=b_id)
    assert not engine_b.gpus.exists()
    gpu = Gpu.objects.get(uuid="GPU-aaa")
    assert gpu.node.name == "node-a" and gpu.claimed_by_id == b_id
    # Shown to admins (the API, and the audit log once, not per report).
    assert agent_b.post("/api/agents/report/", report(2), format="json").status_code == 200
    assert AuditEvent.objects.filter(action="gpu.claim_refused").count() == 1
    listed = client_for("viewer").get(f"/api/gpus/{gpu.pk}/").json()
    assert listed["claimed_by"] == b_id
    # An operator may not reassign; an admin may, audited.
    assert (
        client_for("operator")
        .post(f"/api/gpus/{gpu.pk}/reassign/", {"node": b_id}, format="json")
        .status_code
        == 403
    )
    resp = client_for("admin").post(f"/api/gpus/{gpu.pk}/reassign/", {"node": b_id}, format="json")
    assert resp.status_code == 200 and resp.json()["claimed_by"] is None
    assert AuditEvent.objects.filter(action="gpu.reassigned", object_id=str(gpu.pk)).exists()
    resp = agent_b.post("/api/agents/report/", report(3), format="json")
    assert resp.status_code == 200 and resp.json()["gpus_refused"] == []
    assert list(engine_b.gpus.values_list("uuid", flat=True)) == ["GPU-aaa"]
    assert agent_a.post("/api/agents/report/", report(2), format="json").json()["gpus_refused"] == [
        "GPU-aaa"
    ]


RECORD = {"time": 1764540000, "model": "m", "keys": ["01"], "block_size": 16}


def test_request_records_are_plausible_and_an_agent_speaks_for_its_tenants(enrol, settings):
    node_id, agent = enrol("node-a")
    agent.post("/api/agents/report/", report(1), format="json")
    own = {**RECORD, "tenant": "t1", "engine": "node-a/vllm-0"}
    for bad, field in (
        ({"cached_tokens": 64, "prompt_tokens": 32}, "cached_tokens"),
        ({"ttft_s": settings.PREWARM_RECORD_MAX_TTFT_SECONDS + 1}, "ttft_s"),
    ):
        resp = agent.post("/api/request-records/", {"records": [{**own, **bad}]}, format="json")
        assert resp.status_code == 400 and field in str(resp.json()), resp.content
    assert not DemandBucket.objects.exists()
    # Where an admin named the tenants the node serves, its records count for those only; an
    # agent cannot name them itself at enrolment.
    Node.objects.filter(pk=node_id).update(labels={TENANTS_LABEL: "t1, t2"})
    other = {**own, "tenant": "victim"}
    resp = agent.post("/api/request-records/", {"records": [own, other]}, format="json")
    assert resp.status_code == 403 and resp.json()["field"] == "records[1].tenant"
    assert not DemandBucket.objects.exists()
    assert agent.post("/api/request-records/", {"records": [own]}, format="json").status_code == 200
    _, raw = EnrolmentToken.issue()
    APIClient().post(
        "/api/agents/enrol/",
        {"enrolment_token": raw, "hostname": "node-z", "labels": {TENANTS_LABEL: "victim"}},
        format="json",
    )
    assert TENANTS_LABEL not in Node.objects.get(name="node-z").labels
    # A per-node budget of records a minute: past it, refused whole.
    settings.PREWARM_AGENT_RECORDS_PER_MINUTE = 3
    before = DemandBucket.objects.get().requests
    resp = agent.post("/api/request-records/", {"records": [own] * 3}, format="json")
    assert resp.status_code == 429 and resp.json()["error"] == "records_rate_limited"
    assert DemandBucket.objects.get().requests == before


def _agent(state_dir, enrolment_token: str, transport) -> Reporter:
    """The node agent's reporter for node-r, talking to the real views in-process."""
    return Reporter(
        "http://testserver",
        state_dir,
        {},
        lambda: [gpu_doc("GPU-r-0", 0)],
        lambda: [],
        enrolment_token=enrolment_token,
        hostname="node-r",
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        transport=transport,
    )


async def _flush_until_applied(rep: Reporter) -> None:
    """Flush (as the agent's loop does, after each backoff) until the spool is applied."""
    deadline = time.monotonic() + 30  # a ceiling for a loaded machine; it takes a few flushes
    while not await rep.flush():
        assert time.monotonic() < deadline, "the agent never got its reports applied"
        await asyncio.sleep(max(0.0, rep.retry_at - time.monotonic()))


@pytest.fixture
async def transport():
    """The control plane's ASGI application in-process (its views run in asgiref's one
    thread-sensitive thread, whose database connection is closed after the test)."""
    from controlplane.asgi import application

    yield httpx.ASGITransport(app=application)
    await in_views_thread(connections.close_all)()


@pytest.mark.django_db(transaction=True)
async def test_a_reinstalled_agent_that_kept_its_state_re_enrols_on_its_own(tmp_path, transport):
    """The agent keeps the node's enrolment secret in state.json and presents it when it enrols
    again: a reinstall with a fresh enrolment token whose old agent token was revoked gets its
    own node back without an operator; an agent without that state is refused the name."""
    state = tmp_path / "state"
    state.mkdir()
    first = _agent(state, await sync_to_async(fleet_token)(), transport)
    first.build_report()
    await _flush_until_applied(first)
    await first.aclose()
    kept = json.loads((state / "state.json").read_text())
    assert kept["node_secret"] and kept["agent_token"]
    node = await Node.objects.aget(name="node-r")
    # Meanwhile an admin rotated every token of the node (manage.py rotate_agent_token): the
    # token in the kept state is revoked. The host is reinstalled with a fresh enrolment token.
    await sync_to_async(rotate_agent_token)(node, None)
    again = _agent(state, await sync_to_async(fleet_token)(), transport)
    again.build_report()
    await _flush_until_applied(again)  # 401, enrol with the secret, report
    await again.aclose()
    assert again.state.node_id == node.pk and again.state.agent_token != kept["agent_token"]
    assert again.state.node_secret not in ("", kept["node_secret"])  # renewed, and kept
    usable = await sync_to_async(
        lambda: [t.prefix for t in ApiToken.objects.filter(node=node) if t.usable]
    )()
    assert usable == [again.state.agent_token[: len(usable[0])]]
    assert await Node.objects.acount() == 1
    gpu = await Gpu.objects.select_related("node").aget(uuid="GPU-r-0")
    assert gpu.node_id == node.pk and gpu.claimed_by_id is None  # its GPU is still its own
    enrolled = AuditEvent.objects.filter(action="node.enrolled", object_id=str(node.pk))
    assert [e.reason.rsplit("; ", 1)[1] async for e in enrolled.order_by("pk")] == [
        "new node",
        "its enrolment secret",
    ]
    # Without the kept state (a new host, or someone else's pod with the same fleet token):
    # refused, 403 node_name_taken, and the agent that has the name keeps it.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    stranger = _agent(fresh, await sync_to_async(fleet_token)(), transport)
    assert not await stranger.enrol()
    assert not stranger.state.agent_token
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as anon:
        body = {"enrolment_token": stranger.enrolment_token, "hostname": "node-r"}
        refused = await anon.post("/api/agents/enrol/", json=body)
        assert refused.status_code == 403 and refused.json()["error"] == "node_name_taken"
        heartbeat = await anon.post(
            "/api/agents/heartbeat/",
            json={},
            headers={"Authorization": f"Bearer {again.state.agent_token}"},
        )
        assert heartbeat.status_code == 200, heartbeat.text
    await stranger.aclose()
    assert await AuditEvent.objects.filter(action="node.enrol_refused").acount() == 2
