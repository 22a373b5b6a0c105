"""The agents' job socket, ``/ws/agent/``: jobs pushed to the agent, its events read back.

Authenticated by the agent's bearer token (``Authorization: Bearer pwa_...``; never the URL);
anything else is closed with code 4401. On connect the agent joins its node's group and is sent
every job it has not acknowledged yet (the snapshot); then ``job.assign`` / ``job.cancel``
messages as the dispatch service publishes them. ``job.ack`` / ``job.progress`` / ``job.result``
from the agent go through the same service as the long-poll events endpoint.
"""

from __future__ import annotations

import logging

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.accounts.authentication import AgentAuthFailed
from controlplane.core import protocol as wire
from controlplane.metrics import AGENT_SOCKETS
from controlplane.realtime import groups

from .jobs import agent_node, apply, pending

log = logging.getLogger(__name__)
CLOSE_UNAUTHENTICATED = 4401


def authorization(scope) -> str | None:
    """The socket's ``Authorization`` header (a token in the query string is not looked at)."""
    headers = dict(scope.get("headers") or [])
    return headers.get(b"authorization", b"").decode("latin-1") or None


class AgentConsumer(AsyncJsonWebsocketConsumer):
    node_id: int | None = None

    async def connect(self):
        try:
            self.node_id = await agent_node(authorization(self.scope))
        except AgentAuthFailed:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.channel_layer.group_add(groups.agent(self.node_id), self.channel_name)
        await self.accept()
        AGENT_SOCKETS.inc()
        for msg in await pending(self.node_id):
            await self.send_json(msg)

    async def disconnect(self, code):
        if self.node_id is not None:
            AGENT_SOCKETS.dec()
            await self.channel_layer.group_discard(groups.agent(self.node_id), self.channel_name)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            await self.send_json({"type": wire.MSG_ERROR, "detail": "expected a JSON object"})
            return
        error = await apply(self.node_id, content)
        if error:
            await self.send_json(
                {"type": wire.MSG_ERROR, "job_id": content.get("job_id"), "detail": error}
            )

    # Group messages from controlplane.replication.jobs.delivery (published on commit).
    async def job_assign(self, message):
        await self.send_json(message["payload"])

    async def job_cancel(self, message):
        await self.send_json(wire.job_cancel(message["payload"]["job_id"]))
