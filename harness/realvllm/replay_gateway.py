"""The request driver's gateway: routes each prompt to a real vLLM engine (cache-aware, by the
control plane's residency lookup, or all to one router), replays a trace at its arrival times and
posts the request records in batches. ``driver.py`` is its command line."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.gateway import RecordPoster
from harness.realvllm.traces import BLOCK, TENANT, TraceRequest
from wire.protocol import ENGINE_SERVING

log = logging.getLogger(__name__)

# The request record field naming the engine that served it (docs/api.md).
ENGINE_FIELD = "engine"
# The header naming a request's tenant, for the request taps behind a router.
TENANT_HEADER = "X-Prewarm-Tenant"


@dataclass
class Target:
    engine_id: str  # the engine's id as its agent reports it
    url: str  # the engine's OpenAI-compatible server
    model: str = "tiny"
    node: str = ""  # its node's name: records name the engine as node/engine_id
    serving: bool = True  # a gateway sends nothing to an engine that is not serving yet
    in_flight: int = 0
    served: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def ref(self) -> str:
        """How request records name the engine (docs/api.md): 'node/engine_id'."""
        return f"{self.node}/{self.engine_id}" if self.node else self.engine_id


@dataclass
class DriverStats:
    sent: int = 0
    failed: int = 0
    routed_by_residency: int = 0
    post_failures: int = 0
    per_engine: dict[str, dict[str, int]] = field(default_factory=dict)


class Gateway:
    """Routes each prompt, sends it to the engine, posts the request records in batches."""

    def __init__(
        self,
        control_plane: str,
        gateway_token: str,
        targets: list[Target],
        tenant: str = TENANT,
        client: httpx.Client | None = None,
        keep_records: bool = False,
        post_records: bool = True,
    ):
        """``post_records=False``: a load generator in front of a router and request taps,
        which post the records; nothing is posted from here."""
        if not targets:
            raise ValueError("at least one engine")
        self.cp = control_plane.rstrip("/")
        self.targets = {t.engine_id: t for t in targets}
        self.tenant = tenant
        self.http = client or httpx.Client(timeout=60)
        self.headers = {"Authorization": f"Bearer {gateway_token}"}
        self.lock = threading.Lock()
        self.poster = (
            RecordPoster(self.cp, gateway_token, client=self.http) if post_records else None
        )
        self.stats = DriverStats()
        self.records: list[dict[str, Any]] | None = [] if keep_records else None  # for benches

    # -- routing -------------------------------------------------------------------------------
    def holders(self, token_ids: list[int]) -> dict[str, int]:
        """engine id -> depth (blocks) of the prompt's prefix it holds, per the control plane."""
        try:
            resp = self.http.post(
                f"{self.cp}/api/residency/lookup/",
                headers=self.headers,
                json={"token_ids": token_ids, "block_size": BLOCK},
                timeout=10,
            )
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("residency lookup failed (%s): routing by load", exc)
            return {}
        out: dict[str, int] = {}
        for h in resp.json().get("holders", []):
            t = self.targets.get(h["engine_name"])
            if t is not None and (not t.node or t.node == h.get("node")):
                out[t.engine_id] = max(out.get(t.engine_id, 0), int(h["depth"]))
        return out

    def route(self, token_ids: list[int]) -> Target:
        held = self.holders(token_ids) if len(self.targets) > 1 else {}  # one: nothing to choose
        with self.lock:
            serving = {e: t for e, t in self.targets.items() if t.serving} or self.targets
            held = {e: d for e, d in held.items() if e in serving}
            deepest = max(held.values(), default=0)
            pool = [serving[e] for e, d in held.items() if d == deepest and d > 0]
            if pool:
                self.stats.routed_by_residency += 1
            else:
                pool = list(serving.values())
            best = min(pool, key=lambda t: (t.in_flight, t.served))
            best.in_flight += 1
        return best

    # -- one request ---------------------------------------------------------------------------
    def send(
        self,
        token_ids: list[int],
        max_tokens: int = 1,
        target: Target | None = None,
        tenant: str | None = None,
    ) -> dict | None:
        """Serve one prompt (streamed, so that the time to its first token is measured); returns
        its request record (None if the engine failed)."""
        arrival = time.time()
        if target is None:
            target = self.route(token_ids)
        else:
            with self.lock:
                target.in_flight += 1
        started = time.monotonic()
        try:
            ttft, usage = self._complete(
                target, token_ids, max_tokens, started, tenant or self.tenant
            )
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            with self.lock:
                target.in_flight -= 1
                self.stats.failed += 1
            log.warning("request to %s failed: %s", target.engine_id, exc)
            return None
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        prompt = int(usage.get("prompt_tokens") or len(token_ids))
        record = {
            "time": arrival,
            "model": target.model,
            "tenant": tenant or self.tenant,
            "token_ids": token_ids,
            "block_size": BLOCK,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            ENGINE_FIELD: target.ref,
            "ttft_s": round(ttft, 6),
        }
        with self.lock:
            target.in_flight -= 1
            target.served += 1
            target.prompt_tokens += prompt
            target.cached_tokens += cached
            self.stats.sent += 1
            if self.records is not None:
                self.records.append(record)
        if self.poster is not None:
            self.poster.add(record)
        return record

    def _complete(
        self, target: Target, token_ids: list[int], max_tokens: int, started: float, tenant: str
    ) -> tuple[float, dict[str, Any]]:
        """A streamed completion: (seconds to the first token, the final usage)."""
        body = {
            "model": target.model,
            "prompt": token_ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        ttft: float | None = None
        usage: dict[str, Any] | None = None
        with self.http.stream(
            "POST",
            f"{target.url}/v1/completions",
            json=body,
            headers={TENANT_HEADER: tenant},
            timeout=120,
        ) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if ttft is None and chunk.get("choices"):
                    ttft = time.monotonic() - started
                if chunk.get("usage"):
                    usage = chunk["usage"]
        if ttft is None or usage is None:
            raise ValueError("the stream ended without a token or without usage")
        return ttft, usage

    def flush(self) -> int:
        """Post the records gathered since the last flush (kept for the next one on failure);
        how many the control plane took."""
        if self.poster is None:
            return 0
        before = self.poster.posted
        self.poster.flush()
        with self.lock:
            self.stats.post_failures = self.poster.failures
        return self.poster.posted - before

    def close(self) -> None:
        if self.poster is not None:
            self.poster.close()

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return {
                "sent": self.stats.sent,
                "failed": self.stats.failed,
                "posted": self.poster.posted if self.poster else 0,
                "routed_by_residency": self.stats.routed_by_residency,
                "engines": {
                    t.engine_id: {
                        "served": t.served,
                        "prompt_tokens": t.prompt_tokens,
                        "cached_tokens": t.cached_tokens,
                    }
                    for t in self.targets.values()
                },
            }

    def set_serving(self, engine_id: str, lifecycle: str) -> None:
        """The lifecycle scheduler's listener: route to an engine only while it serves."""
        with self.lock:
            if engine_id in self.targets:
                self.targets[engine_id].serving = lifecycle == ENGINE_SERVING

    # -- a replay ------------------------------------------------------------------------------
    def replay(
        self,
        requests: list[TraceRequest],
        speed: float = 0.5,
        workers: int = 4,
        flush_every_s: float = 1.0,
        stop: threading.Event | None = None,
        loop: bool = False,
    ) -> dict[str, Any]:
        """Send the requests at their trace times (``speed`` x real time); returns the summary."""
        if speed <= 0:
            raise ValueError("speed must be positive")
        stop = stop or threading.Event()
        last_flush = time.monotonic()
        slots = threading.BoundedSemaphore(workers)  # a slow fleet delays arrivals, never piles up

        def one(req: TraceRequest) -> None:
            try:
                self.send(req.token_ids, req.max_tokens, tenant=req.tenant)
            finally:
                slots.release()

        with ThreadPoolExecutor(max_workers=workers) as pool:
            for req in _schedule(requests, speed, loop, stop):
                slots.acquire()
                pool.submit(one, req)
                if time.monotonic() - last_flush >= flush_every_s:
                    self.flush()
                    last_flush = time.monotonic()
        self.flush()
        return self.summary()


def _schedule(
    requests: list[TraceRequest], speed: float, loop: bool, stop: threading.Event
) -> Iterator[TraceRequest]:
    """Yield each request at its time; once more from the start (later) when looping."""
    if not requests:
        return
    span = requests[-1].at_s + 1.0
    rounds = 0
    while not stop.is_set():
        t0 = time.monotonic()
        for req in requests:
            wait = t0 + req.at_s / speed - time.monotonic()
            if wait > 0 and stop.wait(wait):
                return
            yield req
        rounds += 1
        if not loop:
            return
        log.info("trace slice replayed %d time(s) (%.0f trace seconds each)", rounds, span)
