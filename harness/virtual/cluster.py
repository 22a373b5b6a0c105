"""The virtual cluster: the simulator's engines, played in scaled real time for real agents.

``VirtualCluster(setup, options)`` takes a simulator ``Setup`` (cluster shape, cost model and
workload from ``controlplane.sim.scenarios.build``) and, for each engine, opens a vLLM-style KV
event publisher (``publisher.py``), a block-store directory for its agent (``engine.py``) and
HTTP endpoints for its node's GPUs and its ``/metrics`` (``endpoints.py``, fed by
``gauges.py``). It writes one agent configuration per node (``configs.py``): one engine per node,
so one agent per engine.

``run()`` replays the workload: a request arriving at trace time ``t`` is served at wall time
``t / time_scale`` after the start, routed cache-aware by the simulator's router and timed by
its cost model; the blocks it computes and the ones it evicts are published as KV events, and
its record is posted to the control plane as a gateway would (the harness's one gateway client,
``harness/gateway.py``). Engines that join (the scenario's engine changes) are announced to the
control plane through their lifecycle (draining until announced, then warming, then serving;
``harness/lifecycle.py``). Copies the control plane orders move block files between agents; the
target engine sees them land in its store and gains the blocks (``copies.py``). Warm-ups (the
``warmup`` executor's prefill-only requests) are timed by the cost model (``warmups.py``).

Sim time is the trace's own time, so queueing follows the cost model; only the wall clock is
compressed. The control plane sees wall time (records carry the wall arrival time).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import zmq

from controlplane.sim.engine import GONE, PLANNED, SERVING, WARMING
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.scenarios import Setup
from controlplane.sim.workloads.base import BLOCK_TOKENS
from harness.gateway import RecordPoster
from harness.lifecycle import Lifecycles, Operator
from harness.virtual.configs import write_agent_configs
from harness.virtual.copies import Copies
from harness.virtual.endpoints import Endpoints
from harness.virtual.engine import VirtualEngine
from harness.virtual.gauges import Gauges
from harness.virtual.options import Options
from harness.virtual.publisher import KvEventPublisher
from harness.virtual.stats import Stats
from harness.virtual.tokens import TokenBook
from harness.virtual.warmups import Warmup, Warmups
from wire.blockhash import ROOT_PARENT, to_hex
from wire.protocol import ENGINE_DRAINING, ENGINE_SERVING, ENGINE_WARMING

log = logging.getLogger(__name__)
LIFECYCLE_OF = {
    PLANNED: ENGINE_DRAINING,
    WARMING: ENGINE_WARMING,
    SERVING: ENGINE_SERVING,
    GONE: ENGINE_DRAINING,
}
# Names engines report: the cost-model preset is found again from the "8b"/"70b" in them.
MODEL_NAMES = {
    "llama3-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama3-70b": "meta-llama/Llama-3.1-70B-Instruct",
}
HOUSEKEEPING_S = 0.5
# A gateway record with the prompt's token ids (what warm-ups need) per tenant at most this
# often (wall seconds), and at most one such record per second overall: they are large.
TOKEN_RECORD_EVERY_S = 10.0


class VirtualCluster:
    def __init__(self, setup: Setup, options: Options):
        cfg = setup.config
        if cfg.tiers:
            raise ValueError("the virtual cluster plays GPU-only engines (no tiered scenario)")
        if options.time_scale <= 0:
            raise ValueError("time scale must be > 0")
        if options.payload_bytes < 64:
            raise ValueError("payload_bytes must be at least 64")
        cfg.engines_per_node = 1  # one agent per engine: a block store is per agent
        self.setup = setup
        self.opt = options
        self.workload = setup.workload
        from controlplane.sim.cluster import Simulation

        self.sim = Simulation(cfg, self.workload, make_policy("cache-aware"))
        self.policy = self.sim.policy
        self.sim.suffixes = self.workload.suffix_tokens.tolist()
        self.book = TokenBook(self.workload)
        self.model = MODEL_NAMES.get(cfg.cost.model.name, cfg.cost.model.name)
        self.block_bytes = cfg.block_bytes
        self.workdir = Path(options.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.zmq = zmq.Context()
        self.http = Endpoints(
            options.bind_host, options.http_port, on_completion=self.warmup_request
        )
        self._tokens_posted: dict[str, float] = {}  # tenant -> wall time of its last token record
        self._last_token_record = 0.0
        self.engines: list[VirtualEngine] = []
        for e in self.sim.engines:
            eid = f"vc-e{e.eid}"
            ports = (
                (options.base_port + 2 * e.eid, options.base_port + 2 * e.eid + 1)
                if options.base_port
                else (0, 0)
            )
            pub = KvEventPublisher(
                f"kv@{eid}@{self.model}",
                f"tcp://{options.bind_host}:{ports[0]}",
                f"tcp://{options.bind_host}:{ports[1]}",
                ctx=self.zmq,
            )
            self.engines.append(
                VirtualEngine(
                    e,
                    eid,
                    self.model,
                    self.book,
                    options.node_dir(e.eid) / "blocks",
                    options.payload_bytes,
                    pub,
                )
            )
        self.stats = Stats()
        self.stop_event = threading.Event()
        self.started_at: float | None = None
        self.sim_now = 0.0
        self._poster: RecordPoster | None = None
        self.lifecycles = (
            Lifecycles(
                Operator(options.control_plane_url, options.operator_token), "virtual cluster"
            )
            if options.operator_token
            else None
        )
        self.gauges = Gauges(
            self.engines, self.http, cfg.cost, self.block_bytes, self.model, options.node_name
        )
        self.copies = Copies(self.engines, self.book, self.stats)
        self.warmups = Warmups(
            self.sim, self.engines, self.book, self.model, self._warmed, self._forget
        )
        self._request_no = 0
        self._served: TextIO | None = None  # the open served log while ``run`` runs
        self.history: dict[str, Any] | None = None  # the history import's summary
        self.gauges.publish(self.sim_now)

    def agent_configs(self, enrolment_tokens: list[str] | None = None) -> list[Path]:
        """One agent TOML per node (``configs.py``)."""
        return write_agent_configs(
            self.opt,
            self.engines,
            self.http.port,
            self.setup.config,
            self.model,
            self.block_bytes,
            enrolment_tokens,
        )

    # -- control plane ----------------------------------------------------------------------
    def wait_for_agents(self, timeout_s: float = 120.0) -> bool:
        """Wait until every engine appears in the control plane (its agent enrolled and
        reported). Needs the operator token; without it, returns True at once."""
        if self.lifecycles is None:
            return True
        want = {(self.opt.node_name(ve.sim.eid), ve.engine_id) for ve in self.engines}
        return self.lifecycles.wait_for(want, timeout_s, self.stop_event)

    def _sync_lifecycles(self) -> None:
        if self.lifecycles is None or not self.lifecycles.pk:
            return
        for ve in self.engines:
            want = LIFECYCLE_OF[ve.sim.state]
            if self.lifecycles.state.get(ve.engine_id) == want:
                continue
            if self.lifecycles.want(ve.engine_id, want, f"engine {ve.sim.state}"):
                self.stats.lifecycle_changes.append((ve.engine_id, want))

    # -- serving ----------------------------------------------------------------------------
    def serve(self, i: int, t: float) -> dict[str, Any]:
        """Serve request ``i`` of the workload at sim time ``t``; returns its record."""
        sim, wl = self.sim, self.workload
        self.sim.events.run_until(t)
        pid = int(wl.pid[i])
        keys = wl.prefixes[pid]
        e, m, _promo, _lower = self.policy.route(sim, i, t, keys)
        suffix = int(wl.suffix_tokens[i])
        total = len(keys) * BLOCK_TOKENS + suffix
        cached = m * BLOCK_TOKENS
        wait = e.free_at - t if e.free_at > t else 0.0
        service = sim.prefill_s(total - cached, cached)
        e.free_at = t + wait + service
        e.busy_s += service
        e.served += 1
        sim._add_work(t, service)
        no = self._request_no
        self._request_no += 1
        own = self.book.own_blocks(no, keys[-1] if keys else ROOT_PARENT, suffix)
        chain = (*keys, *own)
        ve = self.engines[e.eid]
        before = set(e.cache.blocks)
        evicted = e.cache.use(chain, t)
        ve.publish_changes(before, chain)
        self._forget(evicted)
        st = self.stats
        st.requests += 1
        st.prompt_tokens += total
        st.cached_tokens += cached
        st.ttft.append(wait + service)
        if self._served is not None:
            self._served.write(f"{t:.3f},{wait + service:.6f},{e.eid},{cached},{total}\n")
        self.gauges.queries[e.eid] += total
        self.gauges.hits[e.eid] += cached
        # What a gateway that routed the request knows: the engine that served it, the cached
        # tokens vLLM reported (usage.prompt_tokens_details.cached_tokens) and the TTFT.
        tenant = wl.prefix_wkey[pid]
        record = {
            "time": self._wall_of(t),
            "model": self.model,
            "tenant": tenant,
            "block_size": BLOCK_TOKENS,
            "prompt_tokens": total,
            "cached_tokens": cached,
            "predicted_cached_tokens": m * BLOCK_TOKENS,  # what the router matched on its pick
            "engine": f"{self.opt.node_name(e.eid)}/{ve.engine_id}",
            "ttft_s": round(wait + service, 6),
        }
        wall = time.monotonic()
        if (
            keys
            and wall - self._tokens_posted.get(tenant, -math.inf) >= TOKEN_RECORD_EVERY_S
            and wall - self._last_token_record >= 1.0
        ):
            # Now and then the prompt's token ids (full blocks), as a gateway that tokenizes can.
            self._tokens_posted[tenant] = self._last_token_record = wall
            record["token_ids"] = [tok for k in chain for tok in self.book.tokens_of(k)]
        else:
            record["keys"] = [to_hex(k) for k in chain]
        return record

    def _rejoin(self, offset: float) -> None:
        """A looped pass replays its fleet too: the engines that joined leave (their blocks are
        published removed) and join again at the same points of the next pass, so every pass
        of a looping demo has a scale-out to plan for, not only the first."""
        for e, held in self.sim.rejoin(offset):
            self.engines[e.eid].publish_changes(set(held), ())
            self._forget(held)
            self.stats.rejoins += 1
        self._sync_lifecycles()

    def _forget(self, evicted: list[int]) -> None:
        """Evicted blocks no engine holds any more leave the token book."""
        gone = [k for k in evicted if not any(k in x.cache for x in self.sim.engines)]
        if gone:
            self.book.forget(gone)

    def _wall_of(self, t: float) -> float:
        assert self.started_at is not None
        return self.started_at + t / self.opt.time_scale

    # -- warm-ups and copies (warmups.py, copies.py) -----------------------------------------
    def warmup_request(self, engine_id: str, req: dict[str, Any]) -> dict[str, Any]:
        return self.warmups.request(engine_id, req)

    def _warmed(self, w: Warmup) -> None:
        self.stats.warmups += 1
        self.gauges.queries[w.engine] += len(w.tokens)
        self.gauges.hits[w.engine] += w.cached

    def serve_warmups(self, now: float) -> None:
        self.warmups.serve(now)

    def apply_store_changes(self, t: float) -> None:
        self.copies.apply_store_changes(t)

    # -- the loop ---------------------------------------------------------------------------
    def run(self, duration_s: float | None = None, wait_for_agents_s: float = 120.0) -> Stats:
        """Replay in real time until the workload ends (or ``duration_s`` wall seconds pass,
        or ``stop()``); with ``options.loop`` the workload starts again when it ends."""
        if not self.wait_for_agents(wait_for_agents_s):
            raise TimeoutError("the agents' engines did not appear in the control plane")
        if self.opt.history_days > 0 and self.opt.operator_token:
            from harness.virtual.history import import_trace_history

            o = self.opt
            self.history = import_trace_history(
                self.workload,
                self.model,
                o.control_plane_url,
                o.operator_token,
                o.time_scale,
                o.history_days,
            )
        self._poster = RecordPoster(
            self.opt.control_plane_url, self.opt.gateway_token, self.opt.record_flush_s
        ).start()
        if self.opt.served_log is not None:
            self._served = open(self.opt.served_log, "w")  # noqa: SIM115 (closed below)
            self._served.write("t_s,ttft_s,engine,cached_tokens,prompt_tokens\n")
        wl = self.workload
        times = wl.t.tolist()
        n = len(times)
        scale = self.opt.time_scale
        self.started_at = time.time()
        t0 = time.monotonic()
        offset = 0.0
        i = 0
        next_house = 0.0
        self._sync_lifecycles()
        try:
            while not self.stop_event.is_set():
                wall = time.monotonic() - t0
                if duration_s is not None and wall >= duration_s:
                    break
                self.sim_now = now = wall * scale
                while i < n and offset + times[i] <= now:
                    self._poster.add(self.serve(i, offset + times[i]))
                    i += 1
                if i >= n:
                    end = offset + max(wl.duration_s, times[-1] if n else 0.0)
                    if not self.opt.loop and now >= end:
                        break
                    if self.opt.loop and now >= end:
                        offset, i = end, 0
                        self.sim.events.run_until(end)
                        self._rejoin(end)
                if wall >= next_house:
                    self.sim.events.run_until(now)
                    self._sync_lifecycles()
                    self.apply_store_changes(now)
                    self.serve_warmups(now)
                    self.gauges.publish(now)
                    next_house = wall + HOUSEKEEPING_S
                nxt = (offset + times[i]) / scale if i < n else math.inf
                delay = min(nxt, next_house) - (time.monotonic() - t0)
                if delay > 0:
                    self.stop_event.wait(min(delay, HOUSEKEEPING_S))
        finally:
            self._poster.close()
            if self._served is not None:
                self._served.close()
                self._served = None
        return self.stats

    def stop(self) -> None:
        self.stop_event.set()

    def summary(self) -> dict[str, Any]:
        st = self.stats
        ttft = np.asarray(st.ttft) if st.ttft else np.zeros(1)
        return {
            "engines": len(self.engines),
            "model": self.model,
            "time_scale": self.opt.time_scale,
            "started_at": self.started_at,  # wall (epoch) seconds of trace second 0
            "requests": st.requests,
            "sim_seconds": round(self.sim_now, 1),
            "records_posted": self._poster.posted if self._poster else 0,
            "cached_token_share": round(st.cached_tokens / st.prompt_tokens, 4)
            if st.prompt_tokens
            else 0.0,
            "ttft_mean_s": round(float(ttft.mean()), 4),
            "ttft_p99_s": round(float(np.quantile(ttft, 0.99)), 4),
            "copies_in_blocks": st.copies_in_blocks,
            "copies_in_bytes": st.copies_in_bytes,
            "copies_rejected": st.copies_rejected,
            "replicas_placed": st.replicas_placed,
            "warmups": st.warmups,
            "replicas_used": self.copies.replicas_used(),
            "lifecycle_changes": st.lifecycle_changes,
            "rejoins": st.rejoins,
            "history": self.history,
        }

    def close(self) -> None:
        self.stop_event.set()
        self.warmups.close()
        for ve in self.engines:
            ve.publisher.close()
        self.http.close()
        if self.lifecycles:
            self.lifecycles.operator.close()
        self.zmq.term()
