"""The virtual engines' answer to the ``warmup`` executor: prefill-only requests, timed in sim time.

An agent's warm-up arrives over HTTP (``POST /engines/<id>/v1/completions``, an HTTP thread); it is
queued for the cluster's loop, which starts it after the work already queued on its engine, for
the cost model's prefill time, and answers it as vLLM's OpenAI server does once that time has
passed: its blocks join the engine's cache as any request's do, and are published as KV events.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controlplane.sim.engine import GONE, PLANNED
from controlplane.sim.workloads.base import BLOCK_TOKENS
from wire.blockhash import chain_keys

if TYPE_CHECKING:
    from controlplane.sim.cluster import Simulation
    from harness.virtual.engine import VirtualEngine
    from harness.virtual.tokens import TokenBook

WARMUP_WAIT_S = 120.0  # wall seconds a warm-up request waits for its prefill before a 400


@dataclass
class Warmup:
    """A warm-up request waiting for its engine's prefill (sim time ``ready_at``)."""

    engine: int
    tokens: list[int]
    keys: tuple[int, ...] = ()
    cached: int = 0
    ready_at: float = math.inf
    reply: dict[str, Any] | None = None
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)


class Warmups:
    def __init__(
        self,
        sim: Simulation,
        engines: list[VirtualEngine],
        book: TokenBook,
        model: str,
        on_done: Callable[[Warmup], None],
        forget: Callable[[list[int]], None],
    ):
        self.sim, self.engines, self.book, self.model = sim, engines, book, model
        self.on_done, self.forget = on_done, forget
        self.queue: queue.Queue[Warmup] = queue.Queue()
        self.prefilling: list[Warmup] = []
        self.served = 0

    def request(self, engine_id: str, req: dict[str, Any]) -> dict[str, Any]:
        """``POST /engines/<id>/v1/completions`` (an HTTP thread): queue the prefill for the
        loop, wait for it in sim time, answer as vLLM's OpenAI server does."""
        ve = next((v for v in self.engines if v.engine_id == engine_id), None)
        if ve is None:
            raise ValueError(f"no engine {engine_id!r} in this virtual cluster")
        if req.get("model") != self.model:
            raise ValueError(f"The model `{req.get('model')}` does not exist.")
        prompt = req.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(type(x) is int for x in prompt):
            raise ValueError("this engine takes prompts as lists of token ids")
        w = Warmup(ve.sim.eid, prompt)
        self.queue.put(w)
        if not w.done.wait(WARMUP_WAIT_S) or w.reply is None:
            raise ValueError(w.error or f"the prefill did not finish within {WARMUP_WAIT_S:.0f}s")
        return w.reply

    def serve(self, now: float) -> None:
        """Start queued warm-ups (each takes the cost model's prefill time on its engine, after
        the work already queued there) and finish those whose prefill is done."""
        while True:
            try:
                w = self.queue.get_nowait()
            except queue.Empty:
                break
            e = self.sim.engines[w.engine]
            keys = tuple(chain_keys(w.tokens, BLOCK_TOKENS))
            if e.state in (GONE, PLANNED):
                w.error = f"engine vc-e{w.engine} is not running ({e.state})"
            elif not all(k in self.book.origin for k in keys):
                w.error = "the prompt's blocks are not blocks of this workload"
            if w.error:
                w.done.set()
                continue
            w.keys = keys
            w.cached = e.cache.match(keys) * BLOCK_TOKENS
            service = self.sim.prefill_s(len(w.tokens) - w.cached, w.cached)
            start = max(now, e.free_at)
            e.free_at = w.ready_at = start + service
            e.busy_s += service
            self.sim._add_work(now, service)
            self.prefilling.append(w)
        left = []
        for w in self.prefilling:
            if w.ready_at > now:
                left.append(w)
                continue
            ve = self.engines[w.engine]
            before = set(ve.sim.cache.blocks)
            evicted = ve.sim.cache.use(w.keys, w.ready_at)
            ve.publish_changes(before, w.keys)
            self.forget(evicted)
            self.served += 1
            w.reply = {
                "id": f"cmpl-warmup-{self.served}",
                "object": "text_completion",
                "model": self.model,
                "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": len(w.tokens),
                    "completion_tokens": 1,
                    "total_tokens": len(w.tokens) + 1,
                    "prompt_tokens_details": {"cached_tokens": w.cached},
                },
            }
            self.on_done(w)
            w.done.set()
        self.prefilling = left

    def close(self) -> None:
        for w in [*self.prefilling, *list(self.queue.queue)]:
            w.error = "the virtual cluster stopped"
            w.done.set()
