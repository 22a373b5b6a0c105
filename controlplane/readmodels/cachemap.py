"""The cluster cache map: engines (grouped by node) x the hottest prefixes, and each GPU's VRAM split.

Bounded by construction so it stays fast at hundreds of engines: engines are paged, prefixes are the
top N workload keys by recent demand, and each cell is one character.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q, Sum
from django.utils import timezone

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.configured_index import get_index
from controlplane.fleet.models import Engine
from controlplane.replication.choices import JobAction, JobState
from controlplane.replication.models import ReplicationJob, SpeculativeReplica
from wire import blockhash, protocol

MAX_ENGINES_PER_PAGE = 256
MAX_PREFIXES = 64
DEFAULT_ENGINES_PER_PAGE = 64
DEFAULT_PREFIXES = 24
DEMAND_WINDOW = timedelta(hours=1)

ABSENT, PARTIAL, RESIDENT, SPECULATIVE, IN_FLIGHT, LANDED, LOST = "a", "p", "r", "s", "f", "u", "x"
STATES = {
    ABSENT: "absent",
    PARTIAL: "partly resident",
    RESIDENT: "resident",
    SPECULATIVE: "speculative replica (confirmed by the engine)",
    IN_FLIGHT: "in flight",
    LANDED: "copy landed, not yet confirmed by the engine",
    LOST: "copy lost or never confirmed",
}
IN_FLIGHT_JOB_STATES = protocol.JOB_IN_FLIGHT


def hottest_prefixes(limit: int) -> list[WorkloadKey]:
    """Workload keys with a known prefix, most requested in the last hour first."""
    since = timezone.now() - DEMAND_WINDOW
    return list(
        WorkloadKey.objects.exclude(prefix_keys=[])
        .annotate(recent=Sum("buckets__requests", filter=Q(buckets__start__gte=since)))
        .order_by("-recent", "-last_seen", "pk")[:limit]
    )


def _chain_key(keys: list) -> tuple:
    return tuple(k.lower().rjust(16, "0") for k in keys)


def _speculative(engine_ids: list[int], now) -> tuple[dict, dict]:
    """(engine, chain) -> the status of its speculative replica in its hold (confirmed, landed
    or lost: lost covers never confirmed), and confirmed GPU-tier replica bytes per engine.
    Only a confirmed replica counts as held: a landed copy is not resident until the engine
    shows it."""
    status, spec_bytes = {}, {}
    rows = SpeculativeReplica.objects.filter(
        engine_id__in=engine_ids, shadow=False, expires_at__gt=now
    ).values_list(
        "engine_id",
        "prefix_keys",
        "tier",
        "bytes",
        "confirmed_at",
        "lost_at",
        "evicted_at",
        "job__state",
    )
    rank = {CONFIRMED: 3, CONFIRMED_HOST: 3, LANDED: 2, LOST: 1}
    for engine_id, keys, tier, size, confirmed, lost, evicted, job_state in rows:
        if confirmed and not lost and not evicted:
            st = CONFIRMED if tier == protocol.TIER_GPU else CONFIRMED_HOST
            if tier == protocol.TIER_GPU:
                spec_bytes[engine_id] = spec_bytes.get(engine_id, 0) + size
        elif job_state == JobState.LANDED and not evicted:
            st = LANDED
        elif lost or job_state == JobState.UNCONFIRMED:
            st = LOST
        else:
            continue  # ended by its TTL or an eviction
        key = (engine_id, _chain_key(keys))
        if rank[st] > rank.get(status.get(key), 0):
            status[key] = st
    return status, spec_bytes


CONFIRMED = JobState.CONFIRMED
CONFIRMED_HOST = "confirmed-host"  # in host memory (LMCache's CPU tier): no KV events show it


def _in_flight(engine_ids: list[int]) -> set:
    rows = ReplicationJob.objects.filter(
        target_id__in=engine_ids, action=JobAction.REPLICATE, state__in=IN_FLIGHT_JOB_STATES
    ).values_list("target_id", "prefix_keys")
    return {(engine_id, _chain_key(keys)) for engine_id, keys in rows}


def _gpu_split(
    engines: list[Engine], gpu_blocks: dict[int, int], spec_bytes: dict[int, int]
) -> list[dict]:
    """Per GPU: weights and runtime, KV in use, speculative replicas, unused KV pool, free (bytes).

    An engine's KV pool, blocks and replicas are spread evenly over its GPUs (tensor parallel).
    """
    gpus: dict[int, dict] = {}
    for engine in engines:
        mine = list(engine.gpus.all())
        for gpu in mine:
            row = gpus.setdefault(gpu.pk, {"gpu": gpu, "pool": 0.0, "kv": 0.0, "spec": 0.0})
            share = 1 / len(mine)
            row["pool"] += engine.kv_capacity_bytes * share
            row["kv"] += gpu_blocks.get(engine.pk, 0) * engine.bytes_per_block * share
            row["spec"] += spec_bytes.get(engine.pk, 0) * share
    out = []
    for row in gpus.values():
        gpu = row["gpu"]
        spec = row["spec"]
        kv = max(0.0, row["kv"] - spec)  # replicas are resident blocks too: count them once
        known = gpu.memory_total is not None and gpu.memory_used is not None
        # Engines reserve their KV pool up front: used = weights/runtime + KV pool.
        weights = max(0.0, gpu.memory_used - row["pool"]) if known else None
        pool_free = max(0.0, row["pool"] - kv - spec)
        free = max(0.0, gpu.memory_total - gpu.memory_used) if known else None
        out.append(
            {
                "id": gpu.pk,
                "uuid": gpu.uuid,
                "node": gpu.node.name,
                "index": gpu.index,
                "name": gpu.name,
                "total": gpu.memory_total,
                "used": gpu.memory_used,
                "lost": gpu.lost,
                "weights_runtime": None if weights is None else int(weights),
                "kv": int(kv),
                "speculative": int(spec),
                "kv_pool_free": int(pool_free),
                "free": None if free is None else int(free),
            }
        )
    out.sort(key=lambda g: (g["node"], g["index"]))
    return out


def cache_map(
    offset: int = 0,
    limit: int = DEFAULT_ENGINES_PER_PAGE,
    prefixes: int = DEFAULT_PREFIXES,
    engine_ids: list[int] | None = None,
) -> dict:
    """One page of the cache map. ``engine_ids`` restricts it to those engines (live refresh)."""
    limit = max(1, min(limit, MAX_ENGINES_PER_PAGE))
    prefixes = max(1, min(prefixes, MAX_PREFIXES))
    now = timezone.now()
    total, engines = _engine_page(offset, limit, engine_ids)
    ids = [e.pk for e in engines]
    keys = hottest_prefixes(prefixes)

    index = get_index()
    spec_held, spec_bytes = _speculative(ids, now)
    flying = _in_flight(ids)
    depth = _held_depths(index, keys, set(ids), total)

    rows = []
    gpu_blocks = {}
    for engine in engines:
        cells = [
            _cell(engine.pk, col, key, depth, spec_held, flying) for col, key in enumerate(keys)
        ]
        gpu_blocks[engine.pk] = index.usage(engine.pk).blocks.get(protocol.TIER_GPU, 0)
        rows.append(_engine_row(engine, cells))
    return {
        "generated_at": now.isoformat(),
        "engines_total": total,
        "offset": offset,
        "limit": limit,
        "states": STATES,
        "prefixes": [
            {
                "id": k.pk,
                "tenant": k.tenant,
                "model": k.model,
                "group": k.prefix_group[:8],
                "blocks": len(k.prefix_keys),
                "tokens": k.prefix_tokens,
                "requests_1h": k.recent or 0,
            }
            for k in keys
        ],
        "engines": rows,
        "gpus": _gpu_split(engines, gpu_blocks, spec_bytes),
    }


def _engine_page(offset: int, limit: int, engine_ids: list[int] | None) -> tuple[int, list]:
    """How many engines the map has, and the page's engines (by node, then engine id)."""
    engines_qs = (
        Engine.objects.select_related("node")
        .prefetch_related("gpus__node")
        .order_by("node__name", "engine_id")
    )
    if engine_ids is not None:
        engines_qs = engines_qs.filter(pk__in=engine_ids)
    total = engines_qs.count()
    return total, list(engines_qs[offset : offset + limit])


def _held_depths(index, keys: list, id_set: set[int], total: int) -> dict:
    """(engine pk, prefix column) -> (blocks of the prefix it holds, tier), for the page's
    engines."""
    depth: dict[tuple[int, int], tuple[int, str]] = {}
    for col, key in enumerate(keys):
        chain = [blockhash.from_hex(k) for k in key.prefix_keys]
        for holder in index.holders(chain, limit=max(total, 1) + 16):
            if holder.engine in id_set:
                depth[(holder.engine, col)] = (holder.depth, holder.tier)
    return depth


def _cell(
    engine: int, col: int, key, depth: dict, spec_held: dict, flying: set
) -> tuple[str, int, str]:
    """One engine's cell for one prefix: its state, the blocks it holds and their tier."""
    n = len(key.prefix_keys)
    d, tier = depth.get((engine, col), (0, ""))
    chain = _chain_key(key.prefix_keys)
    spec = spec_held.get((engine, chain))
    if (engine, chain) in flying and d < n:
        state = IN_FLIGHT
    elif (spec == CONFIRMED and d >= n) or spec == CONFIRMED_HOST:
        state = SPECULATIVE
        if spec == CONFIRMED_HOST and d < n:
            # Confirmed by LMCache, in a tier vLLM's KV events do not report.
            tier = protocol.TIER_CPU
    elif spec == LANDED:
        state = LANDED
    elif spec == LOST and d < n:
        state = LOST
    elif d >= n:
        state = RESIDENT
    elif d > 0:
        state = PARTIAL
    else:
        state = ABSENT
    return state, d, tier


def _engine_row(engine: Engine, cells: list[tuple[str, int, str]]) -> dict:
    return {
        "id": engine.pk,
        "name": engine.engine_id,
        "node": engine.node.name,
        "node_id": engine.node_id,
        "node_state": engine.node.state,
        "model": engine.model,
        "lifecycle": engine.lifecycle,
        "synced": engine.residency_synced,
        "engine_scoped_at": engine.engine_scoped_at.isoformat()
        if engine.engine_scoped_at
        else None,
        "engine_scoped_blocks": engine.engine_scoped_blocks,
        "gpus": [g.pk for g in engine.gpus.all()],
        "cells": "".join(state for state, _, _ in cells),
        "depths": [d for _, d, _ in cells],
        "tiers": "".join(tier[:1] or "-" for _, _, tier in cells),
    }
