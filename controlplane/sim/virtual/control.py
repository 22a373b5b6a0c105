"""The virtual cluster's side of the control plane's API: a gateway and an operator.

``RecordPoster`` posts request records as a gateway does (``POST /api/request-records/`` with a
gateway token, batched, in a background thread; a failed batch is kept and sent again, bounded).
``Operator`` reads engines and sets an engine's lifecycle (an operator's user token), which is
how the virtual cluster announces an engine that joins.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)
MAX_BATCH = 5000  # below the server's PREWARM_MAX_RECORDS_PER_BATCH default (20,000)
MAX_BATCH_BYTES = 4 << 20  # half the server's body limit (PREWARM_MAX_BODY_BYTES, 8 MiB)
MAX_BACKLOG = 200_000


class RecordPoster:
    def __init__(self, base_url: str, token: str, flush_s: float = 1.0, timeout_s: float = 10.0):
        if not token:
            raise ValueError("a gateway token is needed to post request records")
        self.url = base_url.rstrip("/") + "/api/request-records/"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.flush_s = flush_s
        self.client = httpx.Client(timeout=timeout_s)
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


class Operator:
    """Engine lookups and lifecycle changes with an operator's user token."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0):
        self.base = base_url.rstrip("/")
        self.client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {token}"})

    def engines(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(node name, engine id) -> the engine as the API shows it."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        url: str | None = f"{self.base}/api/engines/?limit=500"
        while url:
            resp = self.client.get(url)
            resp.raise_for_status()
            page = resp.json()
            for e in page["results"]:
                out[(e["node_name"], e["engine_id"])] = e
            url = page.get("next")
        return out

    def set_lifecycle(self, engine_pk: int, lifecycle: str, reason: str) -> None:
        resp = self.client.post(
            f"{self.base}/api/engines/{engine_pk}/lifecycle/",
            json={"lifecycle": lifecycle, "reason": reason},
        )
        if resp.status_code != 200:
            raise RuntimeError(
                f"lifecycle {lifecycle} for engine {engine_pk}: "
                f"HTTP {resp.status_code} {resp.text[:300]}"
            )

    def close(self) -> None:
        self.client.close()


def wait_until(predicate, timeout_s: float, interval_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False
