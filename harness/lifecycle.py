"""Engines that join (or leave) the fleet, announced to the control plane as an operator would.

``Operator`` reads engines and sets an engine's lifecycle with an operator's user token.
``Lifecycles`` is the one scheduler both harnesses use: it knows each engine's primary key and
current lifecycle, moves an engine to the lifecycle wanted by the legal path (serving -> warming
goes through draining), records every change, and tells a listener (the request driver stops or
starts routing to the engine). The virtual cluster calls ``want()`` with the lifecycle its
simulated engine's state maps to; the real-engine driver runs a timed schedule (``run()``):
draining until announced, warming (copies may land) from ``announce_s``, serving from
``serve_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from wire.protocol import ENGINE_DRAINING, ENGINE_SERVING, ENGINE_WARMING

log = logging.getLogger(__name__)


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


class Lifecycles:
    """The lifecycle of each engine in the control plane, changed on the harness's schedule."""

    def __init__(
        self,
        operator: Operator,
        who: str,
        on_change: Callable[[str, str], None] | None = None,
    ):
        self.operator = operator
        self.who = who  # "virtual cluster", "request driver": said in every change's reason
        self.on_change = on_change
        self.pk: dict[str, int] = {}
        self.state: dict[str, str] = {}
        self.changes: list[tuple[str, str]] = []  # (engine id, lifecycle), in order

    def find(self, engines: set[tuple[str, str]] | set[str]) -> bool:
        """Look the engines up (``(node, engine id)`` pairs, or engine ids on any node); True
        once all are known to the control plane."""
        seen = self.operator.engines()
        found: dict[str, dict[str, Any]] = {}
        for (node, eid), e in seen.items():
            if (node, eid) in engines or eid in engines:
                found[eid] = e
        wanted = {x[1] if isinstance(x, tuple) else x for x in engines}
        if set(found) != wanted:
            return False
        self.pk = {eid: e["id"] for eid, e in found.items()}
        self.state = {eid: e["lifecycle"] for eid, e in found.items()}
        return True

    def wait_for(self, engines: set[Any], timeout_s: float, stop: threading.Event) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not stop.is_set():
            try:
                if self.find(engines):
                    return True
            except (httpx.HTTPError, KeyError, ValueError) as exc:  # may still be starting
                log.info("waiting for the control plane: %s", exc)
            stop.wait(0.5)
        return False

    def want(self, engine_id: str, lifecycle: str, reason: str) -> bool:
        """Move the engine to ``lifecycle`` (no-op when it is there); False if refused."""
        have = self.state.get(engine_id)
        if have == lifecycle:
            return True
        steps = [lifecycle]
        if have == ENGINE_SERVING and lifecycle == ENGINE_WARMING:
            steps = [ENGINE_DRAINING, ENGINE_WARMING]  # serving -> warming goes through draining
        try:
            for s in steps:
                self.operator.set_lifecycle(self.pk[engine_id], s, f"{self.who}: {reason}")
        except (RuntimeError, httpx.HTTPError, KeyError) as exc:
            log.warning("%s", exc)
            return False
        self.state[engine_id] = lifecycle
        self.changes.append((engine_id, lifecycle))
        if self.on_change:
            self.on_change(engine_id, lifecycle)
        log.info("%s is now %s", engine_id, lifecycle)
        return True

    def hold(self, engine_ids: list[str] | set[str] | dict[str, Any]) -> None:
        """Engines that join later: draining (booted, not serving) until their schedule says."""
        for engine_id in engine_ids:
            if not self.want(engine_id, ENGINE_DRAINING, "not serving yet: it joins later"):
                raise RuntimeError(f"{engine_id} could not be set draining")

    def run(self, joins: dict[str, tuple[float, float]], stop: threading.Event) -> None:
        """Engines that join as in a scale-out: each is draining (booted, not serving) now,
        warming from ``announce_s`` and serving from ``serve_s`` (seconds from now)."""
        t0 = time.monotonic()
        self.hold(joins)
        steps = sorted(  # at equal times, an engine is announced before it serves
            (at, phase, eid, what)
            for eid, (announce, serve) in joins.items()
            for phase, (at, what) in enumerate(
                ((announce, ENGINE_WARMING), (serve, ENGINE_SERVING))
            )
        )
        for at, _phase, engine_id, what in steps:
            if stop.wait(max(0.0, t0 + at - time.monotonic())):
                return
            self.want(engine_id, what, "joins the fleet" if what == ENGINE_WARMING else "serves")
