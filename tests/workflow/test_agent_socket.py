"""The agents' job socket: bearer-token auth, unacknowledged jobs on connect, events applied,
cancel pushed. Always disconnects."""

from __future__ import annotations

import contextlib
import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from controlplane.asgi import application
from controlplane.replication.choices import JobState
from controlplane.replication.models import ReplicationJob, SpeculativeReplica
from controlplane.replication.tasks import forecast_then_plan
from tests.workflow.conftest import Fleet

pytestmark = pytest.mark.django_db(transaction=True)


def connect(token: str | None, via_query=False):
    headers = [] if token is None or via_query else [(b"authorization", f"Bearer {token}".encode())]
    path = f"/ws/agent/?token={token}" if via_query else "/ws/agent/"
    return WebsocketCommunicator(application, path, headers=headers)


@database_sync_to_async
def approved_job():
    fleet = Fleet()
    p = fleet.policy("auto")
    fleet.post_burst(time.time())
    forecast_then_plan(p)
    job = ReplicationJob.objects.select_related("source__node", "target__node").first()
    names = {v: k for k, v in fleet.nodes.items()}
    return fleet, job, names[job.source.node_id], names[job.target.node_id]


async def test_unauthenticated_socket_is_closed(eager):
    for token in (None, "pwa_not-a-token"):
        comm = connect(token)
        connected, code = await comm.connect()
        assert not connected and code == 4401
        await comm.disconnect()


async def test_a_token_in_the_url_is_not_accepted(eager):
    # Query strings end up in proxy and access logs: agents authenticate by header only.
    fleet, _job, src, _dst = await approved_job()
    comm = connect(fleet.tokens[src], via_query=True)
    connected, code = await comm.connect()
    assert not connected and code == 4401
    await comm.disconnect()


async def test_job_assign_on_connect_ack_result_and_cancel(eager):
    fleet, job, src, dst = await approved_job()
    target = connect(fleet.tokens[dst])
    source = connect(fleet.tokens[src])
    try:
        assert (await target.connect())[0] and (await source.connect())[0]
        got = await target.receive_json_from(timeout=5)
        assert got["type"] == "job.assign" and got["job"]["id"] == str(job.pk)
        assert got["job"]["role"] == "target" and got["job"]["attempt"] == 1
        assert got["job"]["source"]["transfer"].startswith("127.0.0.1:")
        first = await source.receive_json_from(timeout=5)  # node-a is the source of every job
        assert first["type"] == "job.assign" and first["job"]["role"] == "source"
        await target.send_json_to({"type": "job.ack", "job_id": str(job.pk)})
        await target.send_json_to(
            {"type": "job.progress", "job_id": str(job.pk), "bytes_done": 1024}
        )
        await target.send_json_to({"type": "job.bogus", "job_id": str(job.pk)})
        err = await target.receive_json_from(timeout=5)
        assert err["type"] == "error" and "unknown event type" in err["detail"]
        await job.arefresh_from_db()
        assert job.state == JobState.RUNNING and job.bytes_done == 1024
        # The operator cancels: both agents are told, and a late success changes nothing.
        resp = await database_sync_to_async(fleet.operator.post)(
            f"/api/replication-jobs/{job.pk}/cancel/", {"reason": "wrong prefix"}, format="json"
        )
        assert resp.status_code == 200
        assert await target.receive_json_from(timeout=5) == {
            "type": "job.cancel",
            "job_id": str(job.pk),
        }
        seen = [await source.receive_json_from(timeout=5)]
        while seen[-1]["type"] != "job.cancel":
            seen.append(await source.receive_json_from(timeout=5))
        assert seen[-1]["job_id"] == str(job.pk)
        await target.send_json_to(
            {
                "type": "job.result",
                "job_id": str(job.pk),
                "state": "succeeded",
                "checksum": "00",
                "bytes": job.bytes,
                "error": None,
            }
        )
        assert await target.receive_nothing(timeout=0.3)
        await job.arefresh_from_db()
        assert job.state == JobState.CANCELLED
        assert not await SpeculativeReplica.objects.aexists()
    finally:
        await target.disconnect()
        await source.disconnect()


async def test_a_node_may_not_report_on_another_nodes_job(eager):
    fleet, job, src, dst = await approved_job()
    # A node that joined after the plan: no job involves it (the plan may target every node the
    # fleet had, so "a third node" of the fleet is not necessarily uninvolved).
    await database_sync_to_async(fleet.enrol)("node-late")
    comm = connect(fleet.tokens["node-late"])
    try:
        assert (await comm.connect())[0]
        if not await comm.receive_nothing(timeout=0.3):  # nothing assigned to it
            raise AssertionError(await comm.receive_output())
        await comm.send_json_to({"type": "job.result", "job_id": str(job.pk), "state": "succeeded"})
        assert "does not involve this node" in (await comm.receive_json_from(timeout=5))["detail"]
        await job.arefresh_from_db()
        assert job.state == JobState.DISPATCHED
    finally:
        await comm.disconnect()


IN_MEMORY_LAYER = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def refusing(app, limit: int):
    """The ASGI app behind a server that refuses to send a socket message over ``limit`` bytes,
    as daphne does past its --websocket-max-message-size (autobahn's PayloadExceededError)."""

    async def wrapped(scope, receive, send):
        async def checked_send(message):
            if message.get("type") == "websocket.send" and len(message.get("text") or "") > limit:
                raise RuntimeError(f"message over the server's {limit}-byte limit")
            await send(message)

        await app(scope, receive, checked_send)

    return wrapped


async def _cycles(fleet, node: str, n: int, app=application) -> list[int]:
    """Connect and disconnect ``node``'s agent ``n`` times; the node's group size after each."""
    from channels.layers import get_channel_layer

    from controlplane.realtime import groups

    layer = get_channel_layer()
    node_id = fleet.nodes[node]
    sizes = []
    for _ in range(n):
        comm = WebsocketCommunicator(
            app, "/ws/agent/", headers=[(b"authorization", f"Bearer {fleet.tokens[node]}".encode())]
        )
        # The old consumer raised out of connect: however the socket ends, count the group.
        with contextlib.suppress(Exception):
            await comm.connect()
            await comm.disconnect()
        sizes.append(len(layer.groups.get(groups.agent(node_id), {})))
    return sizes


async def test_an_agent_socket_that_ends_in_an_error_leaves_its_nodes_group(
    eager, settings, monkeypatch
):
    """A consumer that ended in an error (here: reading its pending jobs failed) leaves the node's
    group: a dead channel left in it was sent (a deep copy of) every later job message, and the
    burst demo's web process grew by hundreds of MB a minute while an agent reconnected."""
    settings.CHANNEL_LAYERS = IN_MEMORY_LAYER
    fleet, _job, _src, dst = await approved_job()
    from controlplane.agentapi import consumer

    async def failing(node_id):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(consumer, "pending", failing)
    assert await _cycles(fleet, dst, 20) == [0] * 20


async def test_a_job_message_too_large_for_the_socket_is_left_out_not_resent_forever(
    eager, settings, monkeypatch, caplog
):
    """A job message larger than a socket message may be is not sent (the server would refuse
    it and close the socket; the agent, reconnecting, was sent it again, 86 times a minute in the
    burst demo): the socket stays open, nothing is left behind when it closes, the log says why."""
    settings.CHANNEL_LAYERS = IN_MEMORY_LAYER
    fleet, job, _src, dst = await approved_job()

    from wire import protocol

    monkeypatch.setattr(protocol, "SOCKET_MESSAGE_MAX_BYTES", 200)  # below any job.assign
    app = refusing(application, 200)
    comm = WebsocketCommunicator(
        app, "/ws/agent/", headers=[(b"authorization", f"Bearer {fleet.tokens[dst]}".encode())]
    )
    try:
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "job.bogus", "job_id": str(job.pk)})
        # The socket still answers (the oversized job.assign was left out, not sent first).
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"
    finally:
        await comm.disconnect()
    assert "over the 200-byte limit" in caplog.text and str(job.pk) in caplog.text
    assert await _cycles(fleet, dst, 20, app) == [0] * 20
