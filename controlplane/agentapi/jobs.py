"""What the jobs socket and the long-poll share: the agent's node, its pending jobs, its events.

Async wrappers over ``accounts.authentication.authenticate_agent`` and the dispatch service
(``replication.jobs.delivery``), so both transports authenticate and apply events the same way.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from controlplane.accounts.authentication import agent_token_live, authenticate_agent
from controlplane.core.errors import DomainError
from controlplane.replication.jobs.delivery import apply_event, pending_for_node


@database_sync_to_async
def agent_token(authorization: str | None) -> tuple[int, int]:
    """(node id, token id) of the agent an ``Authorization`` header names, or AgentAuthFailed."""
    token = authenticate_agent(authorization)
    return token.node_id, token.pk


@database_sync_to_async
def token_live(token_id: int) -> bool:
    """Whether an open channel's token still works (not revoked, expired or retired)."""
    return agent_token_live(token_id)


@database_sync_to_async
def pending(node_id: int) -> list[dict]:
    """The ``job.assign`` messages of the jobs the node has not acknowledged."""
    return pending_for_node(node_id)


@database_sync_to_async
def apply(node_id: int, msg: dict) -> str | None:
    """Apply one agent message; the reason it was refused, or None."""
    try:
        apply_event(node_id, msg)
    except DomainError as exc:  # EventError, or a refusal from a service it calls
        return exc.detail
    return None
