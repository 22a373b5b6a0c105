"""The only way state changes reach browsers and agents: published after the transaction commits."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


def send_now(group: str, message_type: str, payload: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": message_type.replace(".", "_"), "event": message_type, "payload": payload})
    except Exception:  # a realtime hiccup must never fail the write that caused it
        log.exception("publishing %s to %s failed", message_type, group)


def publish(group: str, message_type: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` to a Channels group once the current transaction commits."""
    transaction.on_commit(lambda: send_now(group, message_type, payload))
