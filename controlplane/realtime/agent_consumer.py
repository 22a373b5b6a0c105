"""The agents' job socket, ``/ws/agent/``: jobs pushed to the agent, its events read back.

Authenticated by the agent's bearer token (``Authorization: Bearer pwa_...``; never the URL);
anything else is closed with code 4401. On connect the agent joins its node's group and is sent
every job it has not acknowledged yet (the snapshot); then ``job.assign`` / ``job.cancel``
messages as the dispatch service publishes them. ``job.ack`` / ``job.progress`` / ``job.result``
from the agent go through the same service as the long-poll events endpoint.
"""

from __future__ import annotations

import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.accounts.authentication import resolve_token, token_from_header
from controlplane.accounts.choices import TokenKind
from controlplane.metrics import AGENT_SOCKETS

from . import groups

log = logging.getLogger(__name__)
CLOSE_UNAUTHENTICATED = 4401


def raw_token(scope) -> str | None:
    headers = dict(scope.get("headers") or [])
    # Header only: a token in the query string would end up in proxy and access logs.
    return token_from_header(headers.get(b"authorization", b"").decode("latin-1") or None)


@database_sync_to_async
def _node_of(raw: str | None) -> int | None:
    if not raw:
        return None
    token = resolve_token(raw)
    if token is None or token.kind != TokenKind.AGENT or token.node_id is None:
        return None
    return token.node_id


@database_sync_to_async
def _pending(node_id: int) -> list[dict]:
    from controlplane.replication.dispatch import pending_for_node

    return pending_for_node(node_id)


@database_sync_to_async
def _apply(node_id: int, msg: dict) -> str | None:
    from controlplane.replication.dispatch import EventError, apply_event

    try:
        apply_event(node_id, msg)
    except EventError as exc:
        return str(exc)
    return None


class AgentConsumer(AsyncJsonWebsocketConsumer):
    node_id: int | None = None

    async def connect(self):
        self.node_id = await _node_of(raw_token(self.scope))
        if self.node_id is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.channel_layer.group_add(groups.agent(self.node_id), self.channel_name)
        await self.accept()
        AGENT_SOCKETS.inc()
        for msg in await _pending(self.node_id):
            await self.send_json(msg)

    async def disconnect(self, code):
        if self.node_id is not None:
            AGENT_SOCKETS.dec()
            await self.channel_layer.group_discard(groups.agent(self.node_id), self.channel_name)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "detail": "expected a JSON object"})
            return
        error = await _apply(self.node_id, content)
        if error:
            await self.send_json({"type": "error", "job_id": content.get("job_id"), "detail": error})

    # Group messages from controlplane.replication.dispatch (published on commit).
    async def job_assign(self, message):
        await self.send_json(message["payload"])

    async def job_cancel(self, message):
        await self.send_json({"type": "job.cancel", "job_id": message["payload"]["job_id"]})
