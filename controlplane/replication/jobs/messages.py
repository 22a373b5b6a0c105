"""The ``job.assign`` message for each role an agent plays in a job, and what it carries; the
events agents send back, checked before anything is read (``check_event``).

Roles: a ``replicate`` job goes to the source node (role ``source``) and the target node (role
``target``); an ``evict`` job to the target only.
"""

from __future__ import annotations

import time
import uuid
import zlib

from controlplane.core.agent_report import check_document
from controlplane.core.errors import DomainError
from controlplane.fleet.models import Engine
from controlplane.realtime import events
from wire import blockhash, protocol
from wire.protocol import ProtocolError

from ..choices import JobAction, Transport
from ..models import ReplicationJob, SpeculativeReplica
from ..transfer_auth import transfer_secret

SOURCE, TARGET = protocol.ROLE_SOURCE, protocol.ROLE_TARGET


def roles_of(job: ReplicationJob) -> dict[str, Engine]:
    """role -> engine for the agents a job involves."""
    if job.action == JobAction.EVICT or job.source_id is None:
        return {TARGET: job.target} if job.target_id else {}
    return {SOURCE: job.source, TARGET: job.target}


ENGINE_ENDPOINTS = ("transfer", "openai", "kv_peer", "lmcache_instance_id")


def _endpoint(engine: Engine | None) -> dict:
    if engine is None:
        return {}
    ep = engine.endpoints or {}
    return {
        "node_id": engine.node_id,
        "engine_id": engine.engine_id,
        "block_size": engine.block_size,
        **{k: ep.get(k, "") for k in ENGINE_ENDPOINTS},
    }


def assign_message(job: ReplicationJob, role: str) -> dict:
    """The protocol's ``job.assign`` for one role (docs/agent-protocol.md)."""
    src, tgt = _endpoint(job.source), _endpoint(job.target)
    bpb = (job.target or job.source).bytes_per_block if (job.target or job.source) else 0
    master = src.get("transfer", "").rpartition(":")[0] or "127.0.0.1"
    tokens = tokens_for(job) if job.transport in Transport.NEEDS_TOKENS else []
    hold = SpeculativeReplica.objects.filter(job=job).values_list("expires_at", flat=True).first()
    ttl = job.item.plan.policy.replica_ttl_s if job.item_id else 900
    return protocol.job_assign(
        job_id=str(job.pk),
        action=job.action,
        role=role,
        transport=job.transport,
        keys=job.prefix_keys,
        nbytes=job.bytes,
        bytes_per_block=bpb,
        source=src,
        target=tgt,
        # One port per job so concurrent NCCL jobs between the same pair do not collide.
        rendezvous={
            "master_addr": master,
            "world_size": 2,
            "master_port": 29500 + zlib.crc32(job.pk.bytes) % 2000,
        },
        lmcache=_lmcache(job),
        tokens=tokens or [],
        block_size=(job.target or job.source).block_size if tokens else 0,
        # Until when a landed copy is held (LMCache leases are renewed until then).
        hold_until=(hold.timestamp() if hold else time.time() + ttl + 60),
        # The source signs its transfer header with it; the target refuses any other sender.
        secret=transfer_secret(job),
        deadline=job.deadline.timestamp() if job.deadline else None,
        attempt=job.attempt,
    )


def _lmcache(job: ReplicationJob) -> dict:
    """Where an LMCache copy goes: both engines' instance ids (as their agents report them)."""
    if job.transport not in (Transport.LMCACHE, Transport.LMCACHE_MP):
        return {}
    ep = lambda e: (e.endpoints or {}) if e is not None else {}  # noqa: E731
    return {
        "source_instance": ep(job.source).get("lmcache_instance_id", ""),
        "source_location": ep(job.source).get("lmcache_location", ""),
        "target_instance": ep(job.target).get("lmcache_instance_id", ""),
        "model_name": (job.target or job.source).model if (job.target or job.source) else "",
    }


def tokens_for(job: ReplicationJob) -> list[int] | None:
    """The prefix's token ids, from its workload key (only kept where a gateway sent them and a
    plan uses the key), checked against the job's chain; None when unknown or stale."""
    key = job.item.workload_key if job.item_id and job.item.workload_key_id else None
    engine = job.target or job.source
    if key is None or engine is None or not key.prefix_token_ids:
        return None
    n = len(job.prefix_keys) * engine.block_size
    tokens = list(key.prefix_token_ids[:n])
    if len(tokens) < n or [
        blockhash.to_hex(k) for k in blockhash.chain_keys(tokens, engine.block_size)
    ] != [k.lower().rjust(16, "0") for k in job.prefix_keys]:
        return None
    return tokens


class EventError(DomainError, ValueError):
    """An agent event that cannot be applied (unknown job, wrong node, malformed): 400 on
    ``job_id`` unless the raiser names another field or status (an unknown job is a 404)."""

    code = "invalid_event"

    def __init__(self, detail: str, *, field: str = "job_id", status: int = 400):
        super().__init__(detail, field=field, status=status)


# An event's fields, typed and bounded (docs/agent-protocol.md): what a malformed one gets is an
# EventError (400, or {"type": "error"} on the socket), never an exception from deeper down.
EVENT_INT_FIELDS = ("bytes_done", "bytes", "cached_tokens", "prompt_tokens", "report_seq")
EVENT_STR_FIELDS = {"state": 32, "checksum": 128, "error": 2000, "detail": 2000, "executor": 64}
CONFIRMATION_INT_FIELDS = ("tokens", "before")
CONFIRMATION_STR_FIELDS = {"by": 64, "instance_id": 200, "error": 2000}
EVENT_MAX_INT = 2**62  # bytes and tokens; well inside the 64-bit columns they are stored in


def _typed(doc: dict, ints: tuple, strs: dict, where: str = "") -> None:
    for name in ints:
        value = doc.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= EVENT_MAX_INT
        ):
            raise EventError(
                f"{name} must be an integer in [0, {EVENT_MAX_INT}]", field=where + name
            )
    for name, most in strs.items():
        value = doc.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > most):
            raise EventError(
                f"{name} must be a string of at most {most} characters", field=where + name
            )


def check_event(msg: dict) -> None:
    """Refuse a malformed agent event (EventError naming the field) before anything is read."""
    try:
        check_document(msg, "")
    except ProtocolError as exc:
        raise EventError(exc.detail, field=exc.field or "job_id") from None
    kind = msg.get("type")
    if kind not in protocol.AGENT_MESSAGES:
        raise EventError(f"unknown event type {kind!r}", field="type")
    try:
        uuid.UUID(str(msg.get("job_id")))
    except ValueError:
        raise EventError(f"unknown job {msg.get('job_id')!r}", status=404) from None
    _typed(msg, EVENT_INT_FIELDS, EVENT_STR_FIELDS)
    confirmation = msg.get("confirmation") if kind == protocol.MSG_JOB_RESULT else msg
    if kind == protocol.MSG_JOB_RESULT and confirmation is not None:
        if not isinstance(confirmation, dict):
            raise EventError("confirmation must be an object", field="confirmation")
        _typed(confirmation, CONFIRMATION_INT_FIELDS, CONFIRMATION_STR_FIELDS, "confirmation.")
    elif kind == protocol.MSG_JOB_CONFIRM:
        _typed(msg, CONFIRMATION_INT_FIELDS, CONFIRMATION_STR_FIELDS)


def job_update(job: ReplicationJob, detail: str = "") -> events.Event:
    """The dashboard's ``job.update`` for ``job`` as it stands; ``detail``: why it got here."""
    return events.job_update(
        str(job.pk), job.state, job.attempt, job.bytes_done, job.error or "", detail
    )
