"""The dashboard websocket: auth close codes, snapshot then delta, coalescing of bursts."""

import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from rest_framework.test import APIClient

from controlplane.realtime import events, groups
from controlplane.realtime.publish import send_now
from frontend.consumers import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED, DashboardConsumer
from harness import fleet_seed as cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
# A ceiling for a message that is due now (a snapshot, a delta): generous, since a busy machine
# may take seconds to schedule the consumer; a passing test never waits for it.
WAIT_S = 15


class TimedConsumer(DashboardConsumer):
    """The real consumer, noting when each delta left (the coalescing rule is about that)."""

    flushed_at: list[float] = []

    async def flush(self) -> None:
        due = bool(self.coalescer.events)
        await super().flush()
        if due:
            self.flushed_at.append(self.last_flush)


async def connect(user, interval=0.1, consumer=DashboardConsumer):
    from django.conf import settings

    settings.PREWARM_DASHBOARD_COALESCE_SECONDS = interval
    comm = WebsocketCommunicator(consumer.as_asgi(), "/ws/dashboard/")
    comm.scope["user"] = user
    connected, code = await comm.connect()
    return comm, connected, code


async def test_anonymous_socket_is_closed_with_4401():
    comm, connected, code = await connect(AnonymousUser())
    try:
        assert not connected and code == CLOSE_UNAUTHENTICATED
    finally:
        await comm.disconnect()


async def test_user_without_a_role_is_closed_with_4403():
    user = await sync_to_async(cluster.make_user)(None, "nobody")
    comm, connected, code = await connect(user)
    try:
        assert not connected and code == CLOSE_FORBIDDEN
    finally:
        await comm.disconnect()


async def test_route_rejects_a_socket_without_a_session():
    from controlplane.asgi import application

    comm = WebsocketCommunicator(
        application, "/ws/dashboard/", headers=[(b"origin", b"http://localhost")]
    )
    try:
        connected, code = await comm.connect()
        assert not connected and code == CLOSE_UNAUTHENTICATED
    finally:
        await comm.disconnect()


def _post_report(raw, body):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    resp = client.post("/api/agents/report/", body, format="json")
    assert resp.status_code == 200, resp.content


async def test_snapshot_on_connect_then_a_delta_when_an_agent_reports():
    user = await sync_to_async(cluster.make_user)("viewer")
    node, raw = await sync_to_async(cluster.enrol)("node-a")
    await sync_to_async(_post_report)(raw, cluster.report(1, "node-a", engines=1, mode="snapshot"))
    comm, connected, _ = await connect(user)
    try:
        assert connected
        snapshot = await comm.receive_json_from(timeout=WAIT_S)
        # What the cache map's header reads, nothing more (frontend/static/frontend/cachemap.js).
        assert snapshot == {
            "type": "snapshot",
            "nodes": {"active": 1, "stale": 0},
            "engines": 1,
            "open_plans": 0,
            "live_job_count": 0,
        }
        keys = cluster.chain(3, 2)
        await sync_to_async(_post_report)(
            raw, cluster.report(2, "node-a", residency={"vllm-0": cluster.stored(keys)})
        )
        delta = await comm.receive_json_from(timeout=WAIT_S)
        engine_id = await sync_to_async(lambda: node.engines.get().pk)()
        assert delta["type"] == "delta" and delta["residency"] == {"engines": [engine_id]}
        assert set(delta) == {"type", "events", "at", "residency"}  # no GPU memory, no nodes
    finally:
        await comm.disconnect()


async def test_a_burst_is_coalesced_and_nothing_is_lost():
    user = await sync_to_async(cluster.make_user)("operator")
    interval = 0.3
    TimedConsumer.flushed_at = []
    comm, connected, _ = await connect(user, interval=interval, consumer=TimedConsumer)
    try:
        assert connected
        await comm.receive_json_from(timeout=WAIT_S)  # snapshot
        layer = get_channel_layer()
        started = time.monotonic()
        for i in range(200):
            payload = events.residency_delta(1, {str(i): {"stored": 1}}, [], float(i)).payload
            await layer.group_send(
                groups.CLUSTER,
                {"type": "residency_delta", "event": "residency.delta", "payload": payload},
            )
        for pct in (10, 50, 100):
            await layer.group_send(
                groups.JOBS,
                {
                    "type": "job_update",
                    "event": "job.update",
                    "payload": events.job_update("j1", "running", 1, pct, "").payload,
                },
            )
        sending_s = time.monotonic() - started
        messages = []
        while sum(m["events"] for m in messages) < 203:  # until every event has arrived
            messages.append(await comm.receive_json_from(timeout=WAIT_S))
        assert sum(m["events"] for m in messages) == 203
        engines = sorted(e for m in messages for e in m.get("residency", {}).get("engines", []))
        assert engines == list(range(200))
        last_job = [j for m in messages for j in m.get("jobs", [])][-1]
        assert last_job == {"job_id": "j1", "state": "running", "bytes_done": 100, "error": ""}
        # Coalesced: one message per interval at most, however long the burst took to arrive.
        sent = TimedConsumer.flushed_at
        assert len(sent) == len(messages)
        gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
        assert all(g >= interval - 0.01 for g in gaps), gaps  # asyncio may wake a tick early
        assert len(messages) <= 2 + sending_s / interval, (len(messages), sending_s)
    finally:
        await comm.disconnect()


async def test_unknown_event_types_do_not_break_the_socket():
    user = await sync_to_async(cluster.make_user)("viewer")
    comm, connected, _ = await connect(user)
    try:
        await comm.receive_json_from(timeout=WAIT_S)
        # An event no page reads is not sent; the socket goes on with the next one.
        await sync_to_async(send_now)(
            groups.CLUSTER, "forecast.stored", {"key": 7, "model": "ewma"}
        )
        await sync_to_async(send_now)(*events.plan_decided(5, "approved"))
        delta = await comm.receive_json_from(timeout=WAIT_S)
        assert delta == {
            "type": "delta",
            "events": 1,
            "plans": [{"plan_id": 5, "state": "approved"}],
        }
    finally:
        await comm.disconnect()
