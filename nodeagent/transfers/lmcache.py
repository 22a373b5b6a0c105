"""``lmcache`` executor: copy a prefix between two engines' LMCache instances through the LMCache
0.5.6 controller (``python -m lmcache.v1.api_server``), confirm it by pinning it on the target,
and keep it by renewing that lease while the replica is held.

The target's agent calls the controller (see docs/agent.md for why the agent and not the control
plane): it needs ``lmcache_controller_url`` in its configuration and each engine's
``lmcache_instance_id`` (the target's from its own configuration, the source's as the source's
agent reported it). Controller API as 0.5.6 implements it:

- ``POST /query_worker_info {"instance_id"}`` -> ``{"worker_infos": [...]}`` (empty: not registered;
  ``"instance_id": "all"`` matches nothing; ``GET /controller/workers`` lists from a cache);
  first, so that a wrong instance id is named as such (the controller's own answer to a move or
  pin on an unknown instance is "The number of tokens moved should be the same across all
  workers.").
- ``POST /move {"old_position": [instance, location], "new_position": [instance, location],
  "tokens", "should_copy": true}`` -> ``{"event_id", "num_tokens"}``, synchronous: the reply is
  the result (there is no working ``/check_finish``). ``should_copy`` must be spelt so: an
  unknown field such as ``copy`` is ignored, and the copy becomes a move that deletes the
  source's chunks. Only ``LocalCPUBackend`` is a target location LMCache accepts.
- ``POST /pin {"instance_id", "location", "tokens"}`` -> ``{"num_tokens"}``: the resident prefix
  length there, and a lease of the controller's ``pin_timeout_sec`` (300 s by default); pinning
  again extends it. The agent stops renewing at the replica's ``hold_until``.
- There is no unpin and no per-prefix evict (``/clear`` empties a tier of every chunk it may
  evict), and a lapsed lease does not free a copy: the chunks that arrive by a copy are never
  evictable in 0.5.6: after the lease lapsed ``/clear`` frees none of them, and after a copy
  none of the source's chunks either (tried on the real controller and engines:
  ``tests/lmcache/test_controller.py``; as 0.5.6's source reads, the P2P receive and the
  move's read each take a reference to a chunk that they never release, and a chunk with more
  than one is not evictable, by ``/clear`` or LRU). A replica therefore ends by an ``evict``
  job: the executor moves the target's chunks back to the source (``should_copy: false``),
  which removes them from the target by force (pins and all; measured: the target's
  ``lmcache:local_cache_usage`` back to 0); the source stores only the chunks it lacks.

LMCache keys are chained hashes of 256-token chunks of the full token sequence, so the job must
carry the prefix's token ids exactly as the engine tokenized them; only whole chunks are stored
(a 600-token prefix copies 512). The result reports ``bytes`` as the copied tokens at the
engine's bytes per token, and ``confirmation: {"by": "lmcache-pin", "tokens": resident after,
"before": resident before the move, "copied"}``: the pin is read on the target before and after
the copy, and the control plane judges the copy against the tokens its plan asked for (never
this executor's own count: a partial copy is partial). Each renewal reports the resident length
again as a ``job.confirm`` event.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from nodeagent.blockstore import BlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job, Progress, TransferResult
from nodeagent.transfers.http import JsonService, ServiceError
from wire import protocol

log = logging.getLogger(__name__)
NAME = protocol.TRANSPORT_LMCACHE
PIN = protocol.CONFIRM_LMCACHE_PIN


class LmcacheError(ServiceError):
    """The controller refused, failed or could not be reached; the message says which."""


class LmcacheController(JsonService):
    """The LMCache 0.5.6 controller's HTTP API (only what the executor uses)."""

    what = "LMCache controller"
    error = LmcacheError

    def instances(self) -> list[str]:
        """Registered instance ids (``GET /controller/workers``; best effort, for messages)."""
        try:
            resp = self.client.get(self.url + "/controller/workers")
            workers = resp.json().get("workers") or [] if resp.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return []
        return sorted({str(w.get("instance_id")) for w in workers})

    def require(self, instance_id: str, what: str) -> None:
        infos = self.call("POST", "/query_worker_info", {"instance_id": instance_id}).get(
            "worker_infos"
        )
        if not infos:
            known = self.instances()
            raise LmcacheError(
                f"LMCache instance {instance_id!r} ({what}) is not registered with the controller at "
                f"{self.url}: check that engine's lmcache_instance_id"
                + (f" (registered: {', '.join(known)})" if known else "")
            )

    def move(
        self,
        source: tuple[str, str],
        target: tuple[str, str],
        tokens: list[int],
        copy: bool = True,
    ) -> int:
        body = {
            "old_position": list(source),
            "new_position": list(target),
            "tokens": tokens,
            "should_copy": copy,
        }
        return int(self.call("POST", "/move", body).get("num_tokens") or 0)

    def pin(self, instance_id: str, location: str, tokens: list[int]) -> int:
        body = {"instance_id": instance_id, "location": location, "tokens": tokens}
        return int(self.call("POST", "/pin", body).get("num_tokens") or 0)


@dataclass
class Lease:
    """A landed LMCache copy whose pin is renewed until ``hold_until``."""

    job_id: str
    instance_id: str
    location: str
    tokens: list[int]
    expected: int
    hold_until: float
    renewed_at: float = 0.0


Reading = Callable[[dict[str, Any]], None]


class LeaseKeeper:
    """Renews the pins of live LMCache replicas every ``renew_s`` until their hold ends, then
    lets them lapse; each renewal's resident length goes to ``on_reading`` as a ``job.confirm``
    event. Leases are kept in ``path`` so an agent restart keeps renewing them."""

    def __init__(
        self, controller: LmcacheController | None, renew_s: float, path: Path | None = None
    ):
        self.controller = controller
        self.renew_s = renew_s
        self.path = path
        self.on_reading: Reading | None = None
        self.leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if path is not None and path.exists():
            try:
                for raw in json.loads(path.read_text()):
                    lease = Lease(**raw)
                    self.leases[lease.job_id] = lease
            except (ValueError, TypeError) as exc:
                log.warning("ignoring unreadable LMCache lease file %s: %s", path, exc)

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(x) for x in self.leases.values()]))
        os.replace(tmp, self.path)

    def add(self, lease: Lease) -> None:
        with self._lock:
            self.leases[lease.job_id] = lease
            self._save()

    def renew_due(self, now: float | None = None) -> list[dict[str, Any]]:
        """Pin every lease due for renewal; drop those whose hold ended (they lapse by
        themselves). Returns the readings (also handed to ``on_reading``)."""
        now = time.time() if now is None else now
        out = []
        with self._lock:
            ended = [k for k, x in self.leases.items() if x.hold_until <= now]
            for k in ended:
                del self.leases[k]
            due = [x for x in self.leases.values() if now - x.renewed_at >= self.renew_s]
            if ended:
                self._save()
        for lease in due:
            msg: dict[str, Any] = {
                "type": protocol.MSG_JOB_CONFIRM,
                "job_id": lease.job_id,
                "by": PIN,
                "copied": lease.expected,
                "instance_id": lease.instance_id,
                "tokens": 0,
                "error": None,
            }
            try:
                if self.controller is None:
                    raise LmcacheError("no lmcache_controller_url configured")
                msg["tokens"] = self.controller.pin(lease.instance_id, lease.location, lease.tokens)
                lease.renewed_at = now
            except LmcacheError as exc:
                msg["error"] = str(exc)
                log.warning("renewing the LMCache lease of job %s: %s", lease.job_id, exc)
                if "did not answer" in str(exc):
                    continue  # the controller is away: no reading, try again next round
            out.append(msg)
            if self.on_reading is not None:
                self.on_reading(msg)
        return out

    def drop(self, instance_id: str, tokens: list[int]) -> list[str]:
        """Stop renewing the leases on ``instance_id`` over ``tokens``; returns their job ids."""
        with self._lock:
            gone = [
                k
                for k, x in self.leases.items()
                if x.instance_id == instance_id and x.tokens == tokens
            ]
            for k in gone:
                del self.leases[k]
            if gone:
                self._save()
        return gone

    def start(self) -> LeaseKeeper:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="lmcache-leases", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(min(5.0, self.renew_s)):
            try:
                self.renew_due()
            except Exception:  # a renewal bug must not stop the other leases
                log.exception("LMCache lease renewal failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class LmcacheTransport:
    name = NAME

    def __init__(
        self,
        engines: Mapping[str, EngineConfig] | None = None,
        controller_url: str = "",
        renew_s: float = 60.0,
        lease_path: Path | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        self.engines = engines or {}
        self.controller = (
            LmcacheController(controller_url, transport=transport) if controller_url else None
        )
        self.leases = LeaseKeeper(self.controller, renew_s, lease_path)

    def start(self, notify: Reading) -> None:
        """Renew the held replicas' leases (only with a controller to renew them at); each
        reading goes to ``notify`` as a ``job.confirm``."""
        self.leases.on_reading = notify
        if self.controller is not None:
            self.leases.start()

    def stop(self) -> None:
        self.leases.stop()

    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        return TransferResult(True, extra={"executor": NAME})  # the controller moves the chunks

    def _where(self, job: Job) -> tuple[str, str, str, str, str] | str:
        """(target engine id, target instance, its location, source instance, its location),
        or why not."""
        engine_id = str(job.target.get("engine_id") or "")
        engine = self.engines.get(engine_id)
        spec = job.lmcache
        if self.controller is None:
            return "lmcache: this agent has no lmcache_controller_url configured"
        target = (
            engine.lmcache_instance_id
            if engine and engine.lmcache_instance_id
            else str(spec.get("target_instance") or "")
        )
        location = engine.lmcache_location if engine else "LocalCPUBackend"
        source_location = str(spec.get("source_location") or location)
        if not target:
            return f"lmcache: engine {engine_id!r} has no lmcache_instance_id configured"
        return engine_id, target, location, str(spec.get("source_instance") or ""), source_location

    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        where = self._where(job)
        if isinstance(where, str):
            return TransferResult.failed(NAME, where)
        engine_id, target, location, source, source_location = where
        assert self.controller is not None
        if not source:
            return TransferResult.failed(
                NAME, "lmcache: the source engine reported no lmcache_instance_id"
            )
        if not job.tokens:
            return TransferResult.failed(
                NAME,
                "lmcache: the job carries no token ids for the prefix (a gateway must "
                "send token_ids for this workload key)",
            )
        try:
            self.controller.require(source, f"the source engine {job.source.get('engine_id')}")
            self.controller.require(target, f"the target engine {engine_id}")
            # What the target held before: a copy of what it already had places nothing. A
            # reading the controller refuses leaves it unknown (LMCache 0.5.6 answers an engine
            # that holds nothing yet with a 500 now and then); the copy names its own errors.
            try:
                before: int | None = self.controller.pin(target, location, job.tokens)
            except LmcacheError:
                before = None
            copied = self.controller.move((source, source_location), (target, location), job.tokens)
            if copied <= 0:
                return TransferResult.failed(
                    NAME,
                    f"lmcache: the controller copied no tokens from {source!r}: it holds "
                    "none of this prefix's 256-token chunks (the token ids must be exactly "
                    "those the engine stored)",
                )
            progress(job.bytes)
            resident = self.controller.pin(target, location, job.tokens)
        except LmcacheError as exc:
            return TransferResult.failed(NAME, f"lmcache: {exc}")
        bpt = job.bytes_per_block / job.block_size if job.block_size else 0.0
        self.leases.add(
            Lease(
                job.id,
                target,
                location,
                list(job.tokens),
                copied,
                job.hold_until or time.time() + 900,
                renewed_at=time.time(),
            )
        )
        detail = (
            f"copied {copied} tokens {source} -> {target} ({location}); {resident} resident "
            f"({before} before)"
        )
        return TransferResult(
            True,
            int(copied * bpt),
            extra={
                "executor": NAME,
                "detail": detail,
                "confirmation": {
                    "by": PIN,
                    "tokens": resident,
                    "before": before,
                    "copied": copied,
                    "instance_id": target,
                },
            },
        )

    def evict(self, job: Job) -> TransferResult:
        """The replica's hold ended: remove the copied chunks from the target. A lapsed lease
        frees nothing in LMCache 0.5.6 (see the module's docstring), so the target's chunks of
        the prefix are moved back to the source, which drops them from the target; the target
        is read after (``/pin``), and the job fails if it still holds them."""
        where = self._where(job)
        if isinstance(where, str):
            return TransferResult.failed(NAME, where)
        engine_id, target, location, source, source_location = where
        assert self.controller is not None
        if not job.tokens:
            return TransferResult.failed(
                NAME, "lmcache: the evict job carries no token ids for the prefix"
            )
        if not source:
            return TransferResult.failed(
                NAME,
                "lmcache: the evict job names no source instance to hand the copied chunks back "
                "to (LMCache 0.5.6 frees a copy no other way)",
            )
        dropped = self.leases.drop(target, list(job.tokens))
        try:
            self.controller.require(target, f"the target engine {engine_id}")
            self.controller.require(source, "the source the copy came from")
            try:  # what the source holds already (it stores only the chunks it lacks)
                source_held: int | None = self.controller.pin(source, source_location, job.tokens)
            except LmcacheError:
                source_held = None
            # The reply counts the target's tokens of the prefix, each removed from it.
            moved = self.controller.move(
                (target, location), (source, source_location), job.tokens, copy=False
            )
        except LmcacheError as exc:
            return TransferResult.failed(NAME, f"lmcache: evicting from {target!r}: {exc}")
        try:
            left: int | None = self.controller.pin(target, location, job.tokens)
        except LmcacheError:
            left = None  # 0.5.6 answers a pin on an engine holding nothing with a 500 now and then
        if left:
            return TransferResult.failed(
                NAME,
                f"lmcache: {target!r} still holds {left} tokens of the prefix after moving "
                f"{moved} back to {source!r}",
            )
        detail = (
            f"{moved} tokens removed from {target} by moving them back to {source} "
            f"({source_held} of them already there); leases dropped: {len(dropped)}"
            if moved
            else f"{target} held none of the prefix; leases dropped: {len(dropped)}"
        )
        return TransferResult(True, extra={"executor": NAME, "detail": detail})
