"""Build a small (or 256-engine) cluster the way production does: enrolled agents posting reports.

Shared by the dashboard tests, the browser tests and `bench/ui_latency.py` (which import no tests). Reports go through the
real service layer (or the real HTTP API, by the caller's choice); demand is stored as the demand
roll-up would store it.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.utils import timezone

from controlplane.accounts.models import EnrolmentToken
from controlplane.demand.models import DemandBucket, WorkloadKey
from controlplane.fleet import services
from controlplane.fleet.models import Node
from wire import blockhash
from wire.protocol import TIER_GPU

GIB = 1024**3
BYTES_PER_BLOCK = 2 * 1024**2
PASSWORD = "pw-dashboard-123"


def make_user(role: str | None, name: str | None = None) -> User:
    user = User.objects.create_user(name or f"u-{role}-{User.objects.count()}", password=PASSWORD)
    if role:
        user.groups.add(Group.objects.get_or_create(name=role)[0])  # flushed by transactional tests
    return user


def enrol(hostname: str) -> tuple[Node, str]:
    """A node and its raw agent token, through the enrolment service."""
    _, raw = EnrolmentToken.issue()
    node, token, _secret = services.enrol(raw, hostname, {})
    return node, token


def chain(seed: int, blocks: int) -> list[str]:
    """A canonical prefix chain (hex, root first) of ``blocks`` 16-token blocks."""
    tokens = [(seed * 7919 + i) % 32000 for i in range(16 * blocks)]
    return [blockhash.to_hex(k) for k in blockhash.chain_keys(tokens, 16)]


def gpu_doc(uuid: str, index: int, used: int = 60 * GIB, total: int = 80 * GIB) -> dict:
    return {
        "uuid": uuid,
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total": total,
        "memory_used": used,
        "memory_free": total - used,
        "utilization_gpu": 70,
    }


def engine_doc(engine_id: str, gpu_uuids: list[str], kv_blocks: int = 20_000) -> dict:
    return {
        "engine_id": engine_id,
        "kind": "vllm",
        "model": "llama-3.1-70b",
        "block_size": 16,
        "bytes_per_block": BYTES_PER_BLOCK,
        "kv_capacity_blocks": kv_blocks,
        "gpu_uuids": gpu_uuids,
    }


def stored(keys: list[str], medium: str = TIER_GPU) -> list[list]:
    return [[k, keys[i - 1] if i else None, medium, 0] for i, k in enumerate(keys)]


def report(
    seq: int,
    node: str,
    engines: int = 1,
    residency: dict | None = None,
    mode: str = "delta",
    used: int = 60 * GIB,
) -> dict:
    """A report for ``node`` with ``engines`` engines, one GPU each; residency: engine -> stored rows."""
    residency = residency or {}
    gpus = [gpu_doc(f"GPU-{node}-{i}", i, used) for i in range(engines)]
    docs = [engine_doc(f"vllm-{i}", [f"GPU-{node}-{i}"]) for i in range(engines)]
    return {
        "seq": seq,
        "boot_id": f"boot-{node}",
        "sent_at": timezone.now().timestamp(),
        "gpus": gpus,
        "engines": docs,
        "residency": [
            {
                "engine_id": f"vllm-{i}",
                "mode": mode,
                "stored": residency.get(f"vllm-{i}", []),
                "removed": [],
                "cleared": False,
            }
            for i in range(engines)
        ],
    }


def hot_prefix(tenant: str, keys: list[str], requests: int) -> WorkloadKey:
    """A workload key with ``requests`` requests in the current minute."""
    now = timezone.now()
    key = WorkloadKey.objects.create(
        tenant=tenant,
        model="llama-3.1-70b",
        prefix_group=keys[0],
        prefix_keys=keys,
        prefix_tokens=16 * len(keys),
        last_seen=now,
    )
    DemandBucket.objects.create(
        key=key, start=now.replace(second=0, microsecond=0), seconds=60, requests=requests
    )
    return key
