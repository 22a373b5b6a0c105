"""The only way state changes reach browsers and agents: published after the transaction commits."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from .events import Event

log = logging.getLogger(__name__)
_home_loop: asyncio.AbstractEventLoop | None = None


def set_home_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """The event loop an in-memory channel layer lives on (the embedded web server's)."""
    global _home_loop
    _home_loop = loop


def _off_home_loop() -> bool:
    if _home_loop is None or not _home_loop.is_running():
        return False
    try:
        return asyncio.get_running_loop() is not _home_loop
    except RuntimeError:
        return threading.current_thread() is not threading.main_thread()


def send_now(group: str, message_type: str, payload: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": message_type.replace(".", "_"), "event": message_type, "payload": payload}
    try:
        if isinstance(layer, InMemoryChannelLayer) and _off_home_loop():
            # A thread of the embedded worker: the layer's queues belong to the web server's loop.
            asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _home_loop).result(5)
        else:
            async_to_sync(layer.group_send)(group, message)
    except Exception:  # a realtime hiccup must never fail the write that caused it
        log.exception("publishing %s to %s failed", message_type, group)


def _string_keys(value: Any) -> Any:
    # The Redis channel layer's msgpack refuses non-string map keys; the in-memory one does not,
    # so normalise here and both backends carry the same message.
    if isinstance(value, dict):
        return {str(k): _string_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_string_keys(v) for v in value]
    return value


def publish(group: str, message_type: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` to a Channels group once the current transaction commits."""
    payload = _string_keys(payload)
    transaction.on_commit(lambda: send_now(group, message_type, payload))


def publish_event(event: Event) -> None:
    """Send a dashboard event (built by ``realtime.events``) once the current transaction commits."""
    publish(event.group, event.name, event.payload)
