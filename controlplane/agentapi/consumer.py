"""The agents' job socket, ``/ws/agent/``: jobs pushed to the agent, its events read back.

Authenticated by the agent's bearer token (``Authorization: Bearer pwa_...``; never the URL);
anything else is closed with code 4401. On connect the agent joins its node's group and is sent
every job it has not acknowledged yet (the snapshot); then ``job.assign`` / ``job.cancel``
messages as the dispatch service publishes them. ``job.ack`` / ``job.progress`` / ``job.result``
from the agent (JSON text frames, or msgpack binary frames) go through the same service as the
long-poll events endpoint; one that cannot be applied is answered ``{"type": "error"}`` and the
socket stays open.

Revocation reaches an open socket: revoking, rotating or taking over its token, or retiring its
node, sends ``agent.revoked`` to the node's group and the socket holding that token is closed
with 4401; and the token is checked again before every job sent and every event applied.
"""

from __future__ import annotations

import json
import logging

import msgpack
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.accounts.authentication import AgentAuthFailed
from controlplane.metrics import AGENT_SOCKETS
from controlplane.realtime import groups
from wire import protocol

from .jobs import agent_token, apply, pending, token_live

log = logging.getLogger(__name__)
CLOSE_UNAUTHENTICATED = 4401


def authorization(scope) -> str | None:
    """The socket's ``Authorization`` header (a token in the query string is not looked at)."""
    headers = dict(scope.get("headers") or [])
    return headers.get(b"authorization", b"").decode("latin-1") or None


def decode_frame(text_data: str | None, bytes_data: bytes | None):
    """An agent's frame decoded (JSON text or msgpack binary), or ValueError saying why not."""
    try:
        if text_data is not None:
            return json.loads(text_data, parse_constant=_no_constant)
        return msgpack.unpackb(bytes_data or b"", raw=False, strict_map_key=False)
    except (RecursionError, OverflowError) as exc:
        raise ValueError(f"undecodable message: {type(exc).__name__}") from None
    except ValueError as exc:
        raise ValueError(f"undecodable message: {exc}") from None
    except Exception as exc:  # msgpack raises many types for bad bytes
        raise ValueError(f"malformed msgpack: {type(exc).__name__}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class AgentConsumer(AsyncJsonWebsocketConsumer):
    node_id: int | None = None
    token_id: int | None = None
    joined = False  # in the node's group, counted in AGENT_SOCKETS

    async def __call__(self, scope, receive, send):
        # Channels calls disconnect() only when the socket's close reaches a live consumer; a
        # handler that raised (a send the server refused) ended it first, and its channel stayed in
        # the node's group: every later job message to the node was copied into the dead channel
        # (the in-memory layer keeps 100 a channel for 60 s, each a deep copy), the web process
        # grew by hundreds of MB a minute in the burst demo while an agent reconnected. The
        # consumer leaves the group however it ends.
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._leave()

    async def connect(self):
        try:
            self.node_id, self.token_id = await agent_token(authorization(self.scope))
        except AgentAuthFailed:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.channel_layer.group_add(groups.agent(self.node_id), self.channel_name)
        self.joined = True
        await self.accept()
        AGENT_SOCKETS.inc()
        for msg in await pending(self.node_id):
            await self.send_job(msg)

    async def disconnect(self, code):
        await self._leave()

    async def _leave(self) -> None:
        if self.joined:
            self.joined = False
            AGENT_SOCKETS.dec()
            await self.channel_layer.group_discard(groups.agent(self.node_id), self.channel_name)

    async def send_job(self, msg: dict) -> None:
        """Send one job message, unless it is larger than a socket message may be
        (``protocol.SOCKET_MESSAGE_MAX_BYTES``, the agents' and daphne's limit): the server would
        refuse to send it and close the socket, and the agent, reconnecting, be sent it again
        forever. It is left out, said in the log; the job's attempt fails by its deadline."""
        text = await self.encode_json(msg)
        if len(text) > protocol.SOCKET_MESSAGE_MAX_BYTES:  # JSON is ASCII: characters are bytes
            log.warning(
                "job %s for node %s not sent on its socket: %d bytes, over the %d-byte limit",
                (msg.get("job") or {}).get("id") or msg.get("job_id"),
                self.node_id,
                len(text),
                protocol.SOCKET_MESSAGE_MAX_BYTES,
            )
            return
        if not await self._still_authorised():
            return
        await self.send(text_data=text)

    async def _still_authorised(self) -> bool:
        """False (and the socket closed with 4401) once its token stopped working."""
        if self.token_id is not None and await token_live(self.token_id):
            return True
        await self._revoked()
        return False

    async def _revoked(self) -> None:
        await self._leave()
        if self.token_id is not None:  # closed once
            self.token_id = None
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            content = decode_frame(text_data, bytes_data)
        except ValueError as exc:
            await self.send_json({"type": protocol.MSG_ERROR, "detail": str(exc)})
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            await self.send_json({"type": protocol.MSG_ERROR, "detail": "expected a JSON object"})
            return
        if not await self._still_authorised():
            return
        error = await apply(self.node_id, content)
        if error:
            job_id = content.get("job_id")
            await self.send_json(
                {
                    "type": protocol.MSG_ERROR,
                    "job_id": job_id if isinstance(job_id, str) and len(job_id) <= 64 else None,
                    "detail": error,
                }
            )

    # Group messages from controlplane.replication.jobs.delivery (published on commit).
    async def job_assign(self, message):
        await self.send_job(message["payload"])

    async def job_cancel(self, message):
        await self.send_job(protocol.job_cancel(message["payload"]["job_id"]))

    async def agent_revoked(self, message):
        # accounts.services.close_agent_channels: tokens of this node stopped working.
        if self.token_id in message["payload"]["tokens"]:
            await self._revoked()
