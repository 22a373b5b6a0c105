"""``lmcache-mp`` executor: warm a prefix on an LMCache multiprocess server through LMCache's
coordinator (``python -m lmcache.v1.mp_coordinator``), confirm it from the coordinator's
directory, protect it with a pin while held and delete it when the replica ends.

- ``POST /cache/prefetches {"instance_id", "model_name", "world_size", "token_ids"}`` ->
  ``{"request_id", "chunks", "status"}`` (``noop``: shorter than one chunk); the target server
  loads the chunks from its peers or a shared tier. Poll ``GET
  /cache/prefetches/{instance_id}/{request_id}`` until ``completed``.
- ``POST /directory/lookup {"token_ids", "model_name", "world_size"}`` ->
  ``{"chunks", "results": [{"key", "placements": [{"instance_id", "tier", ...}]}]}``: every
  placement of each chunk, as the servers' cache events reported them. The copy is confirmed
  when each chunk lists the target in L1 (``confirmation.by = "lmcache-directory"``; the
  reading counts the chunks from the prefix's first without a gap); a prefetch loads L2 (e.g.
  a file-system tier the servers share) into L1. The server's cache events reach the
  coordinator after the prefetch completes (they are flushed every so often): the directory is
  read until it lists as many chunks on the target as the prefetch found (``found_keys``), for
  at most ``settle_s``.
- ``POST /cache/pins`` / ``DELETE /cache/pins`` (same body): excluded from the coordinator's L2
  eviction plan while held; ``POST /cache/delete {"instance_id", ..., "tier": "l1"}`` drops the
  target's copy when the replica ends (an ``evict`` job).

Unknown instances answer 404 with the coordinator's own sentence, which the error repeats.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx

from nodeagent.blockstore import BlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job, Progress, TransferResult
from nodeagent.transfers.http import JsonService, ServiceError
from wire import protocol

NAME = protocol.TRANSPORT_LMCACHE_MP
DIRECTORY = protocol.CONFIRM_LMCACHE_DIRECTORY
L1 = "l1"  # the coordinator's name for a server's first (DRAM) tier


class CoordinatorError(ServiceError):
    """The coordinator refused, failed or could not be reached."""


class Coordinator(JsonService):
    what = "LMCache coordinator"
    error = CoordinatorError

    def placements(self, body: dict[str, Any]) -> tuple[int, list[set[str]]]:
        """(chunks, the instances holding each chunk in L1) from the directory. A prefetch
        fills L1; a placement in another tier (the L2 a server wrote to) is not the engine's
        copy."""
        doc = self.call("POST", "/directory/lookup", body)
        return int(doc.get("chunks") or 0), [
            {str(p.get("instance_id")) for p in r.get("placements") or [] if p.get("tier") == L1}
            for r in doc.get("results") or []
        ]


class LmcacheMpTransport:
    name = NAME

    def __init__(
        self,
        engines: Mapping[str, EngineConfig] | None = None,
        coordinator_url: str = "",
        poll_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
        settle_s: float = 10.0,
    ):
        self.engines = engines or {}
        self.coordinator = (
            Coordinator(coordinator_url, transport=transport) if coordinator_url else None
        )
        self.poll_s = poll_s
        self.settle_s = settle_s  # how long the directory may lag a completed prefetch

    def _spec(self, job: Job) -> tuple[str, dict[str, Any]] | str:
        engine_id = str(job.target.get("engine_id") or "")
        engine = self.engines.get(engine_id)
        if self.coordinator is None:
            return "lmcache-mp: this agent has no lmcache_coordinator_url configured"
        instance = (
            engine.lmcache_instance_id
            if engine and engine.lmcache_instance_id
            else str(job.lmcache.get("target_instance") or "")
        )
        if not instance:
            return f"lmcache-mp: engine {engine_id!r} has no lmcache_instance_id configured"
        if not job.tokens:
            return "lmcache-mp: the job carries no token ids for the prefix"
        model = str(
            job.lmcache.get("model_name")
            or (engine.served_model_name or engine.model if engine else "")
        )
        return instance, {
            "model_name": model,
            "world_size": int(job.lmcache.get("world_size") or 1),
            "token_ids": list(job.tokens),
        }

    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        return TransferResult(True, extra={"executor": NAME})

    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        spec = self._spec(job)
        if isinstance(spec, str):
            return TransferResult.failed(NAME, spec)
        instance, body = spec
        assert self.coordinator is not None
        try:
            # What the directory listed on the target before: a prefetch of what it already
            # had places nothing (the control plane judges the copy on the difference). A
            # lookup the coordinator refuses leaves it unknown; the prefetch names the error.
            try:
                _, held_before = self.coordinator.placements(body)
                mine_before: int | None = _from_root(held_before, instance)
            except CoordinatorError:
                mine_before = None
            sub = self.coordinator.call(
                "POST", "/cache/prefetches", {"instance_id": instance, **body}
            )
            if sub.get("status") == "noop" or not sub.get("request_id"):
                return TransferResult.failed(
                    NAME,
                    "lmcache-mp: the prefix is shorter than one LMCache chunk: nothing to warm",
                )
            path = f"/cache/prefetches/{instance}/{sub['request_id']}"
            while True:
                state = self.coordinator.call("GET", path)
                status = str(state.get("status", "")).lower()
                if status == "completed":
                    break
                if status in ("failed", "error", "cancelled"):  # not-vocabulary: LMCache's
                    return TransferResult.failed(
                        NAME, f"lmcache-mp: prefetch {sub['request_id']} on {instance!r}: {status}"
                    )
                if job.seconds_left() <= 0:
                    return TransferResult.failed(
                        NAME,
                        f"lmcache-mp: prefetch {sub['request_id']} still {status!r} at the deadline",
                    )
                time.sleep(self.poll_s)
            # The server reports what it loaded as cache events, flushed to the coordinator
            # after the prefetch completes: read the directory until it lists the chunks the
            # prefetch found on the target (bounded), so that a late flush is not a failed copy.
            found = int(state.get("found_keys") or 0)
            settle = time.monotonic() + self.settle_s
            while True:
                chunks, held = self.coordinator.placements(body)
                mine = _from_root(held, instance)
                if mine >= found or time.monotonic() >= settle or job.seconds_left() <= 0:
                    break
                time.sleep(self.poll_s)
            self.coordinator.call("POST", "/cache/pins", body)
        except CoordinatorError as exc:
            return TransferResult.failed(NAME, f"lmcache-mp: {exc}")
        if not chunks:
            return TransferResult.failed(
                NAME, "lmcache-mp: the directory knows no chunk of this prefix"
            )
        per_chunk = len(body["token_ids"]) // chunks if chunks else 0
        progress(job.bytes)
        return TransferResult(
            True,
            0,
            extra={
                "executor": NAME,
                "detail": f"prefetched {chunks} chunks on {instance} ({found} found); "
                f"directory lists {mine} from the root",
                "confirmation": {
                    "by": DIRECTORY,
                    "tokens": mine * per_chunk,
                    "before": None if mine_before is None else mine_before * per_chunk,
                    "chunks": chunks,
                    "instance_id": instance,
                },
            },
        )

    def evict(self, job: Job) -> TransferResult:
        """The replica ended: unpin it and delete the target's (L1) copy."""
        spec = self._spec(job)
        if isinstance(spec, str):
            return TransferResult.failed(NAME, spec)
        instance, body = spec
        assert self.coordinator is not None
        try:
            self.coordinator.call("DELETE", "/cache/pins", body)
            out = self.coordinator.call(
                "POST", "/cache/delete", {"instance_id": instance, **body, "tier": L1}
            )
        except CoordinatorError as exc:
            return TransferResult.failed(NAME, f"lmcache-mp: {exc}")
        return TransferResult(
            True,
            extra={
                "executor": NAME,
                "detail": f"deleted {out.get('affected', 0)} keys "
                f"on {instance} ({out.get('skipped', 0)} skipped)",
            },
        )


def _from_root(held: list[set[str]], instance: str) -> int:
    """How many chunks, from the prefix's first, ``instance`` holds without a gap (an engine
    reuses a cached prefix only up to its first missing chunk)."""
    for i, chunk in enumerate(held):
        if instance not in chunk:
            return i
    return len(held)
