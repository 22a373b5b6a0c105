"""The gateway's side of the control plane's API: request records, posted as a gateway does.

``RecordPoster`` posts request records (``POST /api/request-records/`` with a gateway token) in
batches, from a background thread (``start()``) or when asked (``flush()``); a batch the control
plane did not take for a passing reason (no answer, 5xx, 429) is kept and sent again, bounded; one
it refused as written (another 4xx) is dropped and counted. The virtual cluster and the real
engines' request driver both post through it.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import httpx

log = logging.getLogger(__name__)
MAX_BATCH = 5000  # below the server's PREWARM_MAX_RECORDS_PER_BATCH default (20,000)
MAX_BATCH_BYTES = 4 << 20  # half the server's body limit (PREWARM_MAX_BODY_BYTES, 8 MiB)
MAX_BACKLOG = 200_000


class RecordPoster:
    def __init__(
        self,
        base_url: str,
        token: str,
        flush_s: float = 1.0,
        timeout_s: float = 10.0,
        client: httpx.Client | None = None,
    ):
        if not token:
            raise ValueError("a gateway token is needed to post request records")
        self.url = base_url.rstrip("/") + "/api/request-records/"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.flush_s = flush_s
        self.client = client or httpx.Client(timeout=timeout_s)
        self._own_client = client is None
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.posted = 0
        self.failures = 0
        self.dropped = 0
        self.last_error = ""
        self._thread = threading.Thread(target=self._loop, name="record-poster", daemon=True)

    def start(self) -> RecordPoster:
        self._thread.start()
        return self

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(record)
            if len(self._pending) > MAX_BACKLOG:
                drop = len(self._pending) - MAX_BACKLOG
                del self._pending[:drop]
                self.dropped += drop

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self) -> bool:
        """Send what is pending; False if the control plane did not take it (kept for later)."""
        with self._lock:
            rounds = len(self._pending) // MAX_BATCH + 1  # what is pending now, not what comes
        for _ in range(rounds * 4):  # byte-bounded batches may take more rounds than counted ones
            with self._lock:
                batch = _bounded(self._pending[:MAX_BATCH])
            if not batch:
                return True
            try:
                resp = self.client.post(self.url, json={"records": batch}, headers=self.headers)
            except httpx.HTTPError as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
                return False
            if resp.status_code == 200:
                with self._lock:
                    del self._pending[: len(batch)]
                    self.posted += len(batch)
                continue
            if 400 <= resp.status_code < 500 and resp.status_code != 429:
                # The server refused the batch as written: resending it cannot help.
                with self._lock:
                    del self._pending[: len(batch)]
                    self.dropped += len(batch)
            self._failed(f"HTTP {resp.status_code}: {resp.text[:300]}")
            return False
        return True

    def _failed(self, why: str) -> None:
        self.failures += 1
        if why != self.last_error:
            log.warning("posting request records failed: %s", why)
        self.last_error = why

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.flush()
        if self._own_client:
            self.client.close()


def _bounded(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The longest head of ``records`` whose JSON stays under MAX_BATCH_BYTES (at least one):
    records with token ids of long prefixes are large."""
    size = 0
    for i, rec in enumerate(records):
        size += len(json.dumps(rec)) + 2
        if size > MAX_BATCH_BYTES and i:
            return records[:i]
    return records
