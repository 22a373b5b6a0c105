"""The dashboard websocket: a snapshot on connect, then coalesced deltas from the dashboard groups.

Browsers authenticate with their session (the route is wrapped in Channels' AuthMiddlewareStack).
An anonymous socket is closed with 4401, a user without a role with 4403. Group messages are merged
by a `Coalescer` and flushed at most once per `PREWARM_DASHBOARD_COALESCE_SECONDS`: the first event
after a quiet spell goes out at once (low latency), a burst becomes one message per interval.
"""

from __future__ import annotations

import asyncio
import time

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.readmodels.dashboard import dashboard_snapshot
from controlplane.realtime import groups
from controlplane.realtime.coalesce import Coalescer

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Live updates for one browser tab."""

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        snapshot = await database_sync_to_async(dashboard_snapshot)(user)
        if snapshot is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.coalescer = Coalescer()
        self.interval = float(getattr(settings, "PREWARM_DASHBOARD_COALESCE_SECONDS", 0.1))
        self.last_flush = 0.0
        self.flush_task: asyncio.Task | None = None
        self.joined = list(groups.DASHBOARD_GROUPS)
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json(snapshot)

    async def disconnect(self, code):
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        task = getattr(self, "flush_task", None)
        if task is not None:
            task.cancel()

    async def receive_json(self, content, **kwargs):
        pass  # the dashboard socket is one-way; browsers act through the REST API

    async def dispatch(self, message):
        # Every group event carries "event"; route them all to the coalescer, whatever their type,
        # so a service that starts publishing a new event cannot crash open dashboards.
        if "event" in message and isinstance(message.get("payload"), dict):
            await self.on_event(message["event"], message["payload"])
            return
        await super().dispatch(message)

    async def on_event(self, event: str, payload: dict) -> None:
        if not hasattr(self, "coalescer"):
            return
        if not self.coalescer.add(event, payload):
            return  # nothing a page reads
        if self.flush_task is not None:
            return  # a flush is already due; it will carry this event too
        wait = self.last_flush + self.interval - time.monotonic()
        if wait <= 0:
            await self.flush()
        else:
            self.flush_task = asyncio.ensure_future(self._flush_later(wait))

    async def _flush_later(self, wait: float) -> None:
        await asyncio.sleep(wait)
        self.flush_task = None
        await self.flush()

    async def flush(self) -> None:
        delta = self.coalescer.drain()
        if delta is None:
            return
        self.last_flush = time.monotonic()
        await self.send_json(delta)


# The route's application: session authentication in front of the consumer.
dashboard_app = AuthMiddlewareStack(DashboardConsumer.as_asgi())
