"""Merge a burst of realtime events into one delta, so a busy cluster cannot flood a browser.

Pure logic (no Django): the dashboard consumer feeds every group message in and drains at most one
merged delta per interval. Merging keeps the latest state per object (engine, GPU, job, plan) and
never drops an object, only intermediate values of it.
"""

from __future__ import annotations

from typing import Any


class Coalescer:
    """Accumulates events; ``drain()`` returns one merged delta (or None when nothing is pending)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.events = 0
        self.engines: set[int] = set()
        self.nodes: set[int] = set()
        self.stale_nodes: set[int] = set()
        self.gpus: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}
        self.plans: dict[str, dict] = {}
        self.forecasts: dict[str, dict] = {}
        self.other: dict[str, dict] = {}
        self.last_at: float | None = None

    @property
    def pending(self) -> bool:
        return self.events > 0

    def add(self, event: str, payload: dict[str, Any]) -> None:
        self.events += 1
        if isinstance(payload.get("at"), (int, float)):
            self.last_at = max(self.last_at or 0.0, float(payload["at"]))
        if event == "residency.delta":
            self.engines.update(int(e) for e in payload.get("engines", {}))
            if payload.get("node") is not None:
                self.nodes.add(int(payload["node"]))
            for gpu in payload.get("gpus", []):
                self.gpus[gpu["uuid"]] = {**self.gpus.get(gpu["uuid"], {}), **gpu}
        elif event == "node.stale":
            self.stale_nodes.add(int(payload["node"]))
        elif event.startswith("job."):
            job = str(payload.get("job") or payload.get("job_id") or "")
            if job:
                self.jobs[job] = {**self.jobs.get(job, {}), **payload, "job": job}
        elif event.startswith("plan."):
            plan = str(payload.get("plan", ""))
            self.plans[plan] = {**self.plans.get(plan, {}), **payload, "event": event}
        elif event.startswith("forecast."):
            key = str(payload.get("key", payload.get("forecast", "")))
            self.forecasts[key] = {**self.forecasts.get(key, {}), **payload}
        else:
            self.other[event] = payload

    def drain(self) -> dict[str, Any] | None:
        if not self.events:
            return None
        delta: dict[str, Any] = {"type": "delta", "events": self.events}
        if self.last_at is not None:
            delta["at"] = self.last_at
        if self.engines or self.nodes or self.gpus:
            delta["residency"] = {"engines": sorted(self.engines), "nodes": sorted(self.nodes),
                                  "gpus": list(self.gpus.values())}
        for name in ("stale_nodes",):
            if getattr(self, name):
                delta[name] = sorted(getattr(self, name))
        for name in ("jobs", "plans", "forecasts", "other"):
            value = getattr(self, name)
            if value:
                delta[name] = list(value.values()) if name != "other" else dict(value)
        self._reset()
        return delta
