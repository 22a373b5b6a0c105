"""Request records from the agent's taps, spooled on disk in batches and posted to the control
plane's ``POST /api/request-records/`` (docs/api.md) with the agent's own token.

The same ``Spool`` as reports (framed files, replayed in order, bounded in bytes) holds one file
per batch under ``state_dir/records``. Taps hand records over through a thread-safe queue
(``add``: an append, nothing else), so a request never waits on the disk or the control plane;
every ``interval_s`` (sooner when a batch fills) the pending records become one spooled batch
and the spool is sent while the control plane takes it. Nothing is sent before the control plane
has applied one report of this agent (it would not know the serving engines yet). A batch the
control plane refuses as written (a 4xx other than 401, 403, 408, 429) is dropped and counted;
every other failure keeps it and backs off. At the spool bound new batches are dropped and
counted (the ones waiting are older and as good). A batch naming an engine that is not this
node's (``not_own_engine``: the agent's hostname changed after it enrolled) is dropped too.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from nodeagent.retry import Backoff
from nodeagent.spool import Spool

log = logging.getLogger(__name__)
MAX_BATCH = 2000  # records per batch; the server takes up to 20,000
RETRY_CODES = (401, 403, 408, 429)


class RecordSpool:
    def __init__(
        self,
        base_url: str,
        directory: Path,
        token: Callable[[], str],
        ready: Callable[[], bool],
        *,
        interval_s: float = 1.0,
        max_bytes: int = 64 << 20,
        backoff: Backoff | None = None,
        timeout_s: float = 10.0,
        metrics: Any = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.url = base_url.rstrip("/") + "/api/request-records/"
        self.spool = Spool(directory, max_bytes)
        self.token = token
        self.ready = ready
        self.interval_s = interval_s
        self.backoff = backoff or Backoff(0.5, 30.0)
        self.metrics = metrics
        self.client = httpx.AsyncClient(timeout=timeout_s, transport=transport)
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.seq = max(self.spool.seqs(), default=0)
        self.retry_at = 0.0
        self.was_down = False
        self.posted = 0
        self.dropped = 0
        self.stop_event = asyncio.Event()

    def add(self, record: dict[str, Any]) -> None:
        """Take one record (any thread)."""
        self.queue.append(record)

    def _take(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while self.queue and len(out) < MAX_BATCH:
            out.append(self.queue.popleft())
        return out

    def _write(self, seq: int, records: list[dict[str, Any]]) -> bool:
        body = json.dumps({"records": records}, separators=(",", ":")).encode()
        return self.spool.append(seq, body)

    async def cut(self) -> int:
        """Spool what the taps handed over (in batches); returns the records spooled."""
        n = 0
        while batch := self._take():
            self.seq += 1
            # In a thread: encoding and fsync must not hold the loop the agent reports on.
            if await asyncio.to_thread(self._write, self.seq, batch):
                n += len(batch)
            else:
                self.dropped += len(batch)
                log.warning("record spool bound reached: dropped %d request records", len(batch))
                self._count("dropped", len(batch))
        self._gauge()
        return n

    async def flush(self) -> bool:
        """Send spooled batches in order; False when the control plane did not take them."""
        if time.monotonic() < self.retry_at or not self.ready():
            return False
        headers = {"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"}
        for seq in self.spool.seqs():
            body = await asyncio.to_thread(self.spool.read, seq)
            if body is None:
                continue  # corrupt on disk: removed and counted by the spool
            try:
                resp = await self.client.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                self._fail(f"request records not delivered: {exc!r}")
                return False
            code = resp.status_code
            if code == 200:
                self.spool.remove(seq)
                n = _records_in(body)
                self.posted += n
                self._count("posted", n)
                continue
            if (400 <= code < 500 and code not in RETRY_CODES) or _error(resp) == "not_own_engine":
                # Refused as written: keeping it would block every later batch.
                log.error("request records refused (%s): %s; dropping the batch", code, resp.text)
                self.spool.remove(seq)
                n = _records_in(body)
                self.dropped += n
                self._count("refused", n)
                continue
            self._fail(f"request records: control plane answered {code}")
            return False
        self._gauge()
        if self.was_down:
            self.was_down = False
            log.info("request records: control plane reachable again; spool sent")
        self.backoff.reset()
        return True

    def _fail(self, why: str) -> None:
        self.retry_at = time.monotonic() + self.backoff.next_delay()
        if not self.was_down:
            log.warning("%s; retrying with backoff (spooling meanwhile)", why)
        self.was_down = True
        self._gauge()

    def _count(self, outcome: str, n: int) -> None:
        if self.metrics:
            self.metrics.request_records.labels(outcome).inc(n)

    def _gauge(self) -> None:
        if self.metrics:
            self.metrics.record_spool_batches.set(len(self.spool))

    async def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                await self.cut()
                await self.flush()
            except Exception:  # a bug in one round must not end sending
                log.exception("request records round failed")
            try:
                await asyncio.wait_for(self.stop_event.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass

    async def aclose(self) -> None:
        """Spool what is queued (nothing taken is lost at a stop) and close the client."""
        self.stop_event.set()
        await self.cut()
        await self.client.aclose()


def _error(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def _records_in(body: bytes) -> int:
    """Records in a spooled batch: each has one "time" key, and JSON escapes any quote inside a
    string, so the count is exact."""
    return body.count(b'"time":')
