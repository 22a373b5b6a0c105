"""``lmcache`` transport: the job runs as an LMCache controller move with ``copy=true``.

LMCache controller API: ``POST /move`` ``{"old_position": [instance_id, location],
"new_position": [instance_id, location], "tokens": [...], "copy": true}`` ->
``{"event_id": ..., "num_tokens": ...}``; then ``POST /check_finish`` ``{"event_id": ...}`` ->
``{"status": ...}`` until the status is ``"completed"``. The job's ``lmcache`` object carries
``controller_url``, ``old_position``, ``new_position`` and ``tokens`` (LMCache addresses KV by
tokens, not by our keys). The target agent executes the move; LMCache moves and checks the bytes
itself, so the result carries no Prewarm checksum. The source agent has nothing to do.
"""

from __future__ import annotations

import time

import httpx

from nodeagent.blockstore import BlockStore
from nodeagent.transfers.base import Job, Progress, TransferResult

DONE = "completed"
FAILED = ("failed", "error", "not_found")


class LmcacheTransport:
    name = "lmcache"

    def __init__(self, poll_s: float = 0.2, timeout_s: float = 10.0):
        self.poll_s = poll_s
        self.timeout_s = timeout_s

    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        return TransferResult(True)

    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        spec = job.lmcache
        url = str(spec.get("controller_url") or "").rstrip("/")
        if not url or not spec.get("old_position") or not spec.get("new_position"):
            return TransferResult(
                False, error="lmcache job needs controller_url, old_position, new_position"
            )
        body = {
            "old_position": list(spec["old_position"]),
            "new_position": list(spec["new_position"]),
            "tokens": list(spec.get("tokens") or []),
            "copy": True,
        }
        try:
            with httpx.Client(timeout=self.timeout_s) as client:
                resp = client.post(f"{url}/move", json=body)
                if resp.status_code != 200:
                    return TransferResult(
                        False, error=f"LMCache /move: {resp.status_code} {resp.text[:200]}"
                    )
                event_id = resp.json()["event_id"]
                while True:
                    resp = client.post(f"{url}/check_finish", json={"event_id": event_id})
                    if resp.status_code != 200:
                        return TransferResult(
                            False,
                            error=f"LMCache /check_finish: {resp.status_code} {resp.text[:200]}",
                        )
                    status = str(resp.json().get("status", "")).lower()
                    if status == DONE:
                        progress(job.bytes)
                        return TransferResult(True, job.bytes)
                    if status in FAILED:
                        return TransferResult(False, error=f"LMCache move {event_id}: {status}")
                    if job.seconds_left() <= 0:
                        return TransferResult(
                            False, error=f"LMCache move {event_id} still {status!r} at the deadline"
                        )
                    time.sleep(self.poll_s)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            return TransferResult(False, error=f"LMCache controller {url}: {exc!r}")
