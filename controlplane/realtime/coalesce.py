"""Merge a burst of realtime events into one delta, so a busy cluster cannot flood a browser.

Pure logic (no Django): the dashboard consumer feeds every group message in and drains at most one
merged delta per interval. Merging keeps the latest state per object (engine, job, plan) and never
drops an object, only intermediate values of it.

A delta carries only what a page reads (frontend/static/frontend/*.js): the engines whose residency
changed (the cache map refetches those rows, GPU memory with them), each job's state, progress and
error (the jobs page), each plan's state (the plans page, the cache map's header), keyed as the
events are (``job_id``, ``plan_id``: ``realtime/events.py``). ``events`` (how
many were merged) and ``at`` (the newest event's time) let a client check that nothing was lost and
how late it is. Events no page reads (a node gone stale, a stored forecast, readiness) are not sent.
"""

from __future__ import annotations

from typing import Any

from wire import protocol

JOB_FIELDS = ("state", "bytes_done", "error")  # frontend/static/frontend/jobs.js
PLAN_FIELDS = ("state",)  # frontend/static/frontend/plans.js


class Coalescer:
    """Accumulates events; ``drain()`` returns one merged delta (or None when nothing is pending)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.events = 0
        self.engines: set[int] = set()
        self.jobs: dict[str, dict] = {}
        self.plans: dict[str, dict] = {}
        self.last_at: float | None = None

    @property
    def pending(self) -> bool:
        return self.events > 0

    def add(self, event: str, payload: dict[str, Any]) -> bool:
        """Merge one event; False (and nothing pending) for an event no page reads."""
        if event == protocol.EVENT_RESIDENCY_DELTA:
            engines = payload.get("engines") or {}
            if not engines:
                return False  # GPU figures only: the cache map reads them with its rows
            self.engines.update(int(e) for e in engines)
        elif event.startswith("job."):
            job = str(payload.get("job_id") or "")
            if not job:
                return False
            merged = self.jobs.setdefault(job, {"job_id": job})
            merged.update({k: payload[k] for k in JOB_FIELDS if k in payload})
        elif event.startswith("plan."):
            plan = payload.get("plan_id")
            if plan is None:
                return False
            merged = self.plans.setdefault(str(plan), {"plan_id": plan})
            merged.update({k: payload[k] for k in PLAN_FIELDS if k in payload})
        else:
            return False
        self.events += 1
        if isinstance(payload.get("at"), (int, float)):
            self.last_at = max(self.last_at or 0.0, float(payload["at"]))
        return True

    def drain(self) -> dict[str, Any] | None:
        if not self.events:
            return None
        delta: dict[str, Any] = {"type": "delta", "events": self.events}
        if self.last_at is not None:
            delta["at"] = self.last_at
        if self.engines:
            delta["residency"] = {"engines": sorted(self.engines)}
        if self.jobs:
            delta["jobs"] = list(self.jobs.values())
        if self.plans:
            delta["plans"] = list(self.plans.values())
        self._reset()
        return delta
