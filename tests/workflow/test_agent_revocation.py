"""Revocation reaches every open channel: a node's socket is closed (4401) and its waiting long-poll
ends (401) when its token is rotated, before another job reaches it. And one node's request
records never move another node's replica scores. Waits are for the events themselves."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import HttpCommunicator
from django.test import AsyncClient

from controlplane.accounts import services as account_services
from controlplane.asgi import application
from controlplane.fleet.models import Engine, Node
from controlplane.fleet.services import rotate_agent_token
from controlplane.realtime import groups
from controlplane.realtime.publish import send_now
from controlplane.replication.jobs.messages import TARGET, assign_message
from controlplane.replication.models import SpeculativeReplica
from controlplane.replication.tasks import score_replicas, sweep_jobs
from harness import burst
from tests.workflow.test_agent_socket import IN_MEMORY_LAYER, approved_job, connect
from tests.workflow.test_workflow import finish, run_cycle

CLOSED = {"type": "websocket.close", "code": 4401}


async def _rotate(fleet, name: str) -> None:
    node = await Node.objects.aget(pk=fleet.nodes[name])
    await database_sync_to_async(rotate_agent_token)(node, None)


async def _assign_again(job) -> None:
    """A job.assign for the node's role, published to its group (as a redelivery is)."""
    msg = await database_sync_to_async(assign_message)(job, TARGET)
    await database_sync_to_async(send_now)(groups.agent(job.target.node_id), "job.assign", {**msg})


@pytest.mark.django_db(transaction=True)
async def test_rotation_closes_an_open_socket_before_the_next_job_assign(eager, settings):
    settings.CHANNEL_LAYERS = IN_MEMORY_LAYER
    fleet, job, _src, dst = await approved_job()
    comm = connect(fleet.tokens[dst])
    try:
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=5))["type"] == "job.assign"
        await _rotate(fleet, dst)  # the admin path: every token of the node
        assert await comm.receive_output(timeout=5) == CLOSED
        await _assign_again(job)
        assert await comm.receive_nothing(timeout=0.3)  # the transfer secret went nowhere
    finally:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_an_open_socket_checks_its_token_before_it_sends_a_job(eager, settings, monkeypatch):
    """Even where the revocation message is lost, a socket whose token stopped working sends no
    job and applies no event: it closes first."""
    settings.CHANNEL_LAYERS = IN_MEMORY_LAYER
    monkeypatch.setattr(account_services, "close_agent_channels", lambda *a, **k: None)
    fleet, job, _src, dst = await approved_job()
    comm = connect(fleet.tokens[dst])
    try:
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from(timeout=5))["type"] == "job.assign"
        await _rotate(fleet, dst)
        await _assign_again(job)
        assert await comm.receive_output(timeout=5) == CLOSED
    finally:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_rotation_ends_a_waiting_long_poll(eager, settings):
    settings.CHANNEL_LAYERS = IN_MEMORY_LAYER
    fleet, job, _src, dst = await approved_job()
    token = fleet.tokens[dst]
    client, auth = AsyncClient(), {"authorization": f"Bearer {token}"}
    first = await client.get("/api/agents/jobs/", headers=auth)
    assert first.status_code == 200 and first.json()[0]["type"] == "job.assign", first.content
    pending = first.json()
    for _ in range(10):  # acknowledged: nothing is pending for it now
        for msg in pending:
            job_id = msg["job"]["id"]
            acked = await database_sync_to_async(fleet.agents[dst].post)(
                f"/api/agents/jobs/{job_id}/events/",
                {"type": "job.ack", "job_id": job_id},
                format="json",
            )
            assert acked.status_code == 200, acked.content
        pending = (await client.get("/api/agents/jobs/", headers=auth)).json()
        if not pending:
            break
    assert pending == []
    poll = HttpCommunicator(
        application,
        "GET",
        "/api/agents/jobs/?wait=25",
        headers=[(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())],
    )
    waiting = asyncio.create_task(poll.get_response(timeout=20))
    layer = get_channel_layer()
    group = groups.agent(fleet.nodes[dst])
    deadline = time.monotonic() + 10
    while not layer.groups.get(group):  # the long-poll joined the node's group: it waits
        assert time.monotonic() < deadline and not waiting.done()
        await asyncio.sleep(0.01)
    await _rotate(fleet, dst)
    resp = await asyncio.wait_for(waiting, 10)  # well before its 25 s
    assert resp["status"] == 401, resp


@pytest.mark.django_db(transaction=True)
def test_one_nodes_records_never_move_another_nodes_replica(fleet):
    _, plan = run_cycle(fleet, "auto")
    names = {v: k for k, v in fleet.nodes.items()}
    job = finish(fleet, plan.items.first().jobs.first())
    target = Engine.objects.select_related("node").get(pk=job.target_id)
    fleet.report(names[target.node_id], burst.PREFIX)
    sweep_jobs.delay()
    replica = SpeculativeReplica.objects.get(job=job)
    assert replica.status == "confirmed"
    attacker = next(n for n in fleet.nodes if fleet.nodes[n] != target.node_id)
    own = Engine.objects.get(node_id=fleet.nodes[attacker])
    base = {**burst.records(time.time())[0], "time": time.time()}
    # The attacker's records name only its own engine, but the replica's prefix and tenant, each
    # a miss with a slow first token: before, they set the replica's key figures, its misses'
    # TTFT and (60 of them) flipped its hits to "measured".
    forged = {**base, "engine": f"{attacker}/{own.engine_id}", "cached_tokens": 0, "ttft_s": 9.0}
    resp = fleet.agents[attacker].post(
        "/api/request-records/", {"records": [forged] * 61}, format="json"
    )
    assert resp.status_code == 200, resp.content
    score_replicas.delay()
    replica.refresh_from_db()
    assert (replica.key_requests, replica.miss_ttft_n, replica.served_requests) == (0, 0, 0)
    assert replica.hits == 0 and not replica.hits_measured
    # The replica's own engine's records do count (its agent speaks for its engine).
    prefix_tokens = len(burst.PREFIX) * burst.BLOCK
    served = {**base, "engine": f"{target.node.name}/{target.engine_id}"}
    resp = fleet.agents[target.node.name].post(
        "/api/request-records/",
        {"records": [{**served, "cached_tokens": prefix_tokens, "ttft_s": 0.05}]},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    score_replicas.delay()
    replica.refresh_from_db()
    assert (replica.served_requests, replica.served_hits, replica.key_requests) == (1, 1, 1)
    assert replica.hits == 1 and replica.hits_measured
