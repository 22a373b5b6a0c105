"""What the jobs socket and the long-poll share: the agent's node, its pending jobs, its events.

Async wrappers over ``accounts.authentication.authenticate_agent`` and the dispatch service
(``replication.jobs.delivery``), so both transports authenticate and apply events the same way.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from controlplane.accounts.authentication import authenticate_agent
from controlplane.replication.jobs.delivery import apply_event, pending_for_node
from controlplane.replication.jobs.states import EventError


@database_sync_to_async
def agent_node(authorization: str | None) -> int:
    """The node of the agent an ``Authorization`` header names, or AgentAuthFailed."""
    return authenticate_agent(authorization).node_id


@database_sync_to_async
def pending(node_id: int) -> list[dict]:
    """The ``job.assign`` messages of the jobs the node has not acknowledged."""
    return pending_for_node(node_id)


@database_sync_to_async
def apply(node_id: int, msg: dict) -> str | None:
    """Apply one agent message; the reason it was refused, or None."""
    try:
        apply_event(node_id, msg)
    except EventError as exc:
        return str(exc)
    return None
