"""The ``job.assign`` message for each role an agent plays in a job, and what it carries.

Roles: a ``replicate`` job goes to the source node (role ``source``) and the target node (role
``target``); an ``evict`` job to the target only.
"""

from __future__ import annotations

import time
import zlib

from controlplane.fleet.models import Engine
from controlplane.realtime import events
from wire import blockhash, protocol

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
    ttl = job.item.plan.policy.replica_ttl_seconds if job.item_id else 900
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


def job_update(job: ReplicationJob, detail: str = "") -> events.Event:
    """The dashboard's ``job.update`` for ``job`` as it stands; ``detail``: why it got here."""
    return events.job_update(
        str(job.pk), job.state, job.attempt, job.bytes_done, job.error or "", detail
    )
