"""The dashboard websocket: auth close codes, snapshot then delta, coalescing of bursts."""

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from rest_framework.test import APIClient

from controlplane.realtime import groups
from controlplane.realtime.consumers import (
    CLOSE_FORBIDDEN,
    CLOSE_UNAUTHENTICATED,
    DashboardConsumer,
)
from controlplane.realtime.publish import send_now

from . import cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def connect(user, interval=0.1):
    from django.conf import settings

    settings.PREWARM_DASHBOARD_COALESCE_SECONDS = interval
    comm = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
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

    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[(b"origin", b"http://localhost")])
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
        snapshot = await comm.receive_json_from(timeout=2)
        assert snapshot["type"] == "snapshot" and snapshot["role"] == "viewer"
        assert snapshot["nodes"]["active"] == 1 and snapshot["engines"] == 1
        keys = cluster.chain(3, 2)
        await sync_to_async(_post_report)(raw, cluster.report(2, "node-a", residency={"vllm-0": cluster.stored(keys)}))
        delta = await comm.receive_json_from(timeout=2)
        engine_id = await sync_to_async(lambda: node.engines.get().pk)()
        assert delta["type"] == "delta" and delta["residency"]["engines"] == [engine_id]
        assert delta["residency"]["nodes"] == [node.pk]
        assert delta["residency"]["gpus"][0]["uuid"] == "GPU-node-a-0"
    finally:
        await comm.disconnect()


async def test_a_burst_is_coalesced_and_nothing_is_lost():
    user = await sync_to_async(cluster.make_user)("operator")
    comm, connected, _ = await connect(user, interval=0.3)
    try:
        assert connected
        await comm.receive_json_from(timeout=2)  # snapshot
        layer = get_channel_layer()
        for i in range(200):
            payload = {"node": 1, "engines": {str(i): {"stored": 1}}, "gpus": [], "at": float(i)}
            await layer.group_send(groups.CLUSTER, {"type": "residency_delta", "event": "residency.delta", "payload": payload})
        for pct in (10, 50, 100):
            await layer.group_send(groups.JOBS, {"type": "job_progress", "event": "job.progress",
                                                 "payload": {"job": "j1", "bytes_done": pct}})
        messages = []
        while not await comm.receive_nothing(timeout=0.8):  # a timed-out receive would kill the app
            messages.append(await comm.receive_json_from())
        assert 1 <= len(messages) <= 3  # 203 events, at most one message per 0.3 s
        engines = sorted(e for m in messages for e in m.get("residency", {}).get("engines", []))
        assert engines == list(range(200))
        assert sum(m["events"] for m in messages) == 203
        last_job = [j for m in messages for j in m.get("jobs", [])][-1]
        assert last_job == {"job": "j1", "bytes_done": 100}
    finally:
        await comm.disconnect()


async def test_unknown_event_types_do_not_break_the_socket():
    user = await sync_to_async(cluster.make_user)("viewer")
    comm, connected, _ = await connect(user)
    try:
        await comm.receive_json_from(timeout=2)
        await sync_to_async(send_now)(groups.FORECASTS, "forecast.stored", {"key": 7, "model": "ewma"})
        delta = await comm.receive_json_from(timeout=2)
        assert delta["forecasts"] == [{"key": 7, "model": "ewma"}]
    finally:
        await comm.disconnect()
