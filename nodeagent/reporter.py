"""Enrolment, reports and heartbeats to the control plane (``docs/agent-protocol.md``).

Each tick builds one report (seq strictly increasing and persisted), writes it to the spool and
then sends the spool in order. Between ticks, a change to residency (``poke``, from the engines'
KV-event threads) brings the next report forward: at once when the last report is at least
``min_interval_s`` old, else when it becomes so; changes in between are coalesced into that one
report, so an agent sends at most ``1 / min_interval_s`` reports a second however busy its
engines are. While the control plane is unreachable only ticks report.

A failed send leaves the report spooled and backs off exponentially with jitter; ticks keep
spooling meanwhile, so an outage loses nothing as long as the spool bound holds. When it does not, the spool is dropped (counted) and the next report is a
full snapshot. ``409 stale_seq`` drops what the server already has.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgpack

from nodeagent.engine_residency import EngineResidency
from nodeagent.retry import Backoff
from nodeagent.spool import Spool
from wire.protocol import (
    CONTENT_JSON,
    CONTENT_MSGPACK,
    ENCODING_JSON,
    ENCODING_MSGPACK,
)

log = logging.getLogger(__name__)


@dataclass
class AgentState:
    """What survives restarts: identity (the agent token, and the node's enrolment secret that
    proves it is this node when it must enrol again) and the last seq used."""

    node_id: int | None = None
    agent_token: str = ""
    seq: int = 0
    node_secret: str = ""

    @classmethod
    def load(cls, path: Path) -> AgentState:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        return cls(
            data.get("node_id"),
            data.get("agent_token", ""),
            int(data.get("seq", 0)),
            data.get("node_secret", ""),
        )

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the token
        with os.fdopen(fd, "w") as f:
            json.dump(
                {
                    "node_id": self.node_id,
                    "agent_token": self.agent_token,
                    "seq": self.seq,
                    "node_secret": self.node_secret,
                },
                f,
            )
        os.replace(tmp, path)


class Reporter:
    def __init__(
        self,
        base_url: str,
        state_dir: Path,
        residencies: dict[str, EngineResidency],
        collect_gpus: Callable[[], list[dict[str, Any]]],
        describe_engines: Callable[[], list[dict[str, Any]]],
        *,
        enrolment_token: str = "",
        hostname: str = "",
        labels: dict[str, str] | None = None,
        transports: list[str] | None = None,
        interval_s: float = 1.0,
        min_interval_s: float = 0.1,
        heartbeat_s: float = 15.0,
        timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        spool_max_bytes: int = 64 << 20,
        encoding: str = ENCODING_MSGPACK,
        metrics: Any = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.state_path = state_dir / "state.json"
        self.state = AgentState.load(self.state_path)
        self.spool = Spool(state_dir / "spool", spool_max_bytes)
        self.residencies = residencies
        self.collect_gpus = collect_gpus
        self.describe_engines = describe_engines
        self.enrolment_token = enrolment_token
        self.hostname = hostname
        self.labels = labels or {}
        self.transports = list(transports or [])  # what this agent's executors can run
        self.interval_s = interval_s
        self.min_interval_s = min_interval_s
        self.heartbeat_s = heartbeat_s
        self.backoff = Backoff(backoff_initial_s, backoff_max_s)
        self.encoding = encoding
        # Integer keys in msgpack (the compact wire); hex in JSON, whose readers lose 64-bit ints.
        self.hex_keys = encoding == ENCODING_JSON
        self.metrics = metrics
        self.boot_id = str(uuid.uuid4())
        self.client = httpx.AsyncClient(timeout=timeout_s, transport=transport)
        self.retry_at = 0.0  # monotonic time before which sends are not attempted
        self.was_down = False
        self.force_snapshot = True  # first report after start is a snapshot
        self.pending_drop_note = 0
        self.last_applied_seq: int | None = None
        self.stop_event = asyncio.Event()
        self.changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poked = False
        if metrics and self.spool.corrupt_reports:
            metrics.spool_corrupt.inc(self.spool.corrupt_reports)

    # -- identity --------------------------------------------------------------------------
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.state.agent_token}"}

    async def enrol(self) -> bool:
        """Enrol (token and the node's enrolment secret kept in the state file); True when the
        agent has an identity. Enrolling again (state kept, token no longer accepted) presents
        the secret: the control plane re-enrols a taken node name only with its proof."""
        if self.state.agent_token:
            return True
        if not self.enrolment_token:
            log.error("not enrolled and no enrolment_token configured: cannot report")
            return False
        body = {
            "enrolment_token": self.enrolment_token,
            "hostname": self.hostname,
            "labels": self.labels,
        }
        if self.state.node_secret:
            body["node_secret"] = self.state.node_secret
        resp = await self.client.post(f"{self.base_url}/api/agents/enrol/", json=body)
        if resp.status_code != 201:
            log.error("enrolment refused (%s): %s", resp.status_code, resp.text[:200])
            return False
        data = resp.json()
        self.state.node_id = data["node_id"]
        self.state.agent_token = data["agent_token"]
        self.state.node_secret = str(data.get("node_secret") or self.state.node_secret)
        if data.get("report_interval_s"):
            self.interval_s = float(data["report_interval_s"])
        self.state.save(self.state_path)
        log.info("enrolled as node %s", self.state.node_id)
        return True

    # -- building ---------------------------------------------------------------------------
    def build_report(self) -> tuple[int, bytes]:
        """Take the deltas (or snapshots) and spool one report; returns (seq, body)."""
        snapshot_all = self.force_snapshot
        self.force_snapshot = False
        gpus = self.collect_gpus()
        engines = self.describe_engines()
        residency = [
            e
            for r in self.residencies.values()
            if (e := r.take_entry(snapshot_all, self.hex_keys)) is not None
        ]
        self.state.seq += 1
        seq = self.state.seq
        self.state.save(self.state_path)
        report: dict[str, Any] = {
            "seq": seq,
            "boot_id": self.boot_id,
            "sent_at": time.time(),
            "transports": self.transports,
            "gpus": gpus,
            "engines": engines,
            "residency": residency,
        }
        body = self._encode(report)
        if not self.spool.append(seq, body):
            dropped = self.spool.drop_all()
            log.warning("spool bound reached: dropped %d reports, sending a snapshot", dropped)
            if self.metrics:
                self.metrics.spool_dropped.inc(dropped)
            report["residency"] = [
                r.take_entry(force_snapshot=True, hex_keys=self.hex_keys)
                for r in self.residencies.values()
            ]
            report["residency"] = [e for e in report["residency"] if e is not None]
            body = self._encode(report)
            if not self.spool.append(seq, body):
                log.error(
                    "one snapshot report (%d bytes) is larger than the spool bound", len(body)
                )
        self._gauge()
        return seq, body

    def cut(self) -> int:
        """Spool what the engines' KV events have said so far (a report, sent with the spool on
        the next flush) and return the seq that holds it: everything after is later."""
        seq, _ = self.build_report()
        return seq

    def _encode(self, report: dict[str, Any]) -> bytes:
        return encode_report(report, self.encoding)

    def _gauge(self) -> None:
        if self.metrics:
            self.metrics.spool_reports.set(len(self.spool))
            self.metrics.spool_bytes.set(self.spool.total_bytes)

    # -- sending ----------------------------------------------------------------------------
    async def flush(self) -> bool:
        """Send spooled reports in order; False when the control plane is unreachable."""
        if time.monotonic() < self.retry_at:
            return False
        if not self.state.agent_token:
            try:
                if not await self.enrol():
                    self._fail()
                    return False
            except httpx.HTTPError as exc:
                log.warning("enrolment failed: %s", exc)
                self._fail()
                return False
        ctype = CONTENT_MSGPACK if self.encoding == ENCODING_MSGPACK else CONTENT_JSON
        for seq in self.spool.seqs():
            body = self.spool.read(seq)
            if body is None:  # corrupted on disk since start: skipped, a snapshot repairs it
                self.force_snapshot = True
                if self.metrics:
                    self.metrics.spool_corrupt.inc()
                continue
            t0 = time.perf_counter()
            try:
                resp = await self.client.post(
                    f"{self.base_url}/api/agents/report/",
                    content=body,
                    headers={**self._auth(), "Content-Type": ctype},
                )
            except httpx.HTTPError as exc:
                self._fail(f"report {seq} not delivered: {exc!r}")
                return False
            if self.metrics:
                self.metrics.report_latency.observe(time.perf_counter() - t0)
            if not self._handle(seq, resp):
                return False
        self._gauge()
        if self.was_down:
            self.was_down = False
            self.force_snapshot = True  # snapshot on reconnect
            log.info("control plane reachable again; spool flushed")
        self.backoff.reset()
        return True

    def _count(self, outcome: str) -> None:
        if self.metrics:
            self.metrics.reports.labels(outcome).inc()

    def _handle(self, seq: int, resp: httpx.Response) -> bool:
        code = resp.status_code
        if code == 200:
            data = resp.json()
            self.spool.remove(seq)
            self.last_applied_seq = data.get("applied_seq", seq)
            for engine_id in data.get("snapshot_requested") or []:
                if engine_id in self.residencies:
                    self.residencies[engine_id].request_snapshot()
            self._count("applied")
            return True
        if code == 409:
            data = _json(resp)
            last = data.get("last_seq")
            if isinstance(last, int):
                self.spool.drop_through(last)
                if last >= self.state.seq:
                    # Our counter is behind the server's (state lost): jump past it; deltas
                    # dropped above are replaced by a snapshot.
                    self.state.seq = last
                    self.state.save(self.state_path)
                    self.force_snapshot = True
            self.spool.remove(seq)
            self._count("stale")
            return True
        if code in (401, 403):
            self._fail(f"report refused ({code}): agent token not accepted")
            self._count("unauthorized")
            if code == 401 and self.enrolment_token and self.state.node_secret:
                # Revoked (or lost by the control plane): enrol again on the next flush, proving
                # this node with its enrolment secret.
                log.warning("agent token no longer accepted: enrolling again as %s", self.hostname)
                self.state.agent_token = ""
                self.state.save(self.state_path)
            return False
        if code in (400, 413):
            # The report itself is wrong or too big: keeping it would block the spool forever.
            log.error(
                "report %d rejected (%s): %s; dropping it and sending a snapshot",
                seq,
                code,
                resp.text[:300],
            )
            self.spool.remove(seq)
            self.force_snapshot = True
            self._count("rejected")
            return True
        self._fail(f"report {seq}: control plane answered {code}")
        return False

    def _fail(self, why: str = "") -> None:
        delay = self.backoff.next_delay()
        self.retry_at = time.monotonic() + delay
        if why and not self.was_down:
            log.warning("%s; retrying with backoff (spooling meanwhile)", why)
        self.was_down = True
        self._count("failed")
        self._gauge()

    async def heartbeat(self) -> None:
        if not self.state.agent_token:
            return
        try:
            await self.client.post(
                f"{self.base_url}/api/agents/heartbeat/",
                json={"boot_id": self.boot_id, "sent_at": time.time()},
                headers=self._auth(),
            )
        except httpx.HTTPError:
            pass  # reports carry liveness too; the next heartbeat tries again

    # -- loops ------------------------------------------------------------------------------
    def poke(self) -> None:
        """Residency changed (any thread): report it soon. One wake-up per report, however many
        KV-event batches arrive meanwhile."""
        loop = self._loop
        if loop is None or self._poked:
            return
        self._poked = True
        try:
            loop.call_soon_threadsafe(self.changed.set)
        except RuntimeError:
            pass  # the loop has closed: the agent is stopping

    async def _wait(self, deadline: float, last: float) -> None:
        """Until the next tick (``deadline``), a stop, or a change (then no sooner than
        ``min_interval_s`` after the report at ``last``)."""
        now = time.monotonic()
        if now >= deadline:
            return
        stop = asyncio.ensure_future(self.stop_event.wait())
        change = asyncio.ensure_future(self.changed.wait())
        try:
            done, _ = await asyncio.wait(
                {stop, change}, timeout=deadline - now, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stop.cancel()
            change.cancel()
        if change not in done or self.stop_event.is_set() or self.was_down:
            if self.was_down and change in done:  # only ticks report during an outage
                await self._sleep(deadline - time.monotonic())
            return
        await self._sleep(min(last + self.min_interval_s, deadline) - time.monotonic())

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def run(self) -> None:
        """Fixed-rate loop on the monotonic clock: one report per interval, never drifting, and
        one sooner when residency changes (module docstring)."""
        self._loop = asyncio.get_running_loop()
        start = time.monotonic()
        deadline = start  # the next tick
        next_hb = start
        while not self.stop_event.is_set():
            # Before taking the deltas: a change applied from here on wakes the next wait.
            self._poked = False
            self.changed.clear()
            last = time.monotonic()
            try:
                self.build_report()
                await self.flush()
                now = time.monotonic()
                if now >= next_hb:
                    await self.heartbeat()
                    next_hb = now + self.heartbeat_s
            except Exception:  # a bug in one tick must not end reporting
                log.exception("report tick failed")
            now = time.monotonic()
            if now >= deadline - 1e-3:  # that was the tick: the next on the grid (ticks we
                # overran are skipped, not burst to catch up); a change's report keeps it
                n = max(
                    round((deadline - start) / self.interval_s) + 1,
                    int((now - start) / self.interval_s) + 1,
                )
                deadline = start + n * self.interval_s
            await self._wait(deadline, last)

    async def aclose(self) -> None:
        self.stop_event.set()
        await self.client.aclose()


def encode_report(report: dict[str, Any], encoding: str = ENCODING_MSGPACK) -> bytes:
    """A report body as sent (its residency rows from ``wire.protocol``'s encoder)."""
    if encoding == ENCODING_MSGPACK:
        return msgpack.packb(report, use_bin_type=True)
    return json.dumps(report, separators=(",", ":")).encode()


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
