"""The virtual cluster: the simulator's engines, played in scaled real time for real agents.

``VirtualCluster(setup, options)`` takes a simulator ``Setup`` (cluster shape, cost model and
workload from ``controlplane.sim.scenarios.build``) and, for each engine, opens a vLLM-style KV
event publisher (``publisher.py``), a block-store directory for its agent (``engine.py``) and
HTTP endpoints for its node's GPUs and its ``/metrics`` (``endpoints.py``). It writes one agent
configuration per node (``agent_configs``): one engine per node, so one agent per engine.

``run()`` replays the workload: a request arriving at trace time ``t`` is served at wall time
``t / time_scale`` after the start, routed cache-aware by the simulator's router and timed by
its cost model; the blocks it computes and the ones it evicts are published as KV events, and
its record is posted to the control plane as a gateway would (``control.py``). Engines that join
(the scenario's engine changes) are announced to the control plane through their lifecycle
(draining until announced, then warming, then serving). Copies the control plane orders move
block files between agents; the target engine sees them land in its store and gains the blocks.

Sim time is the trace's own time, so queueing follows the cost model; only the wall clock is
compressed. The control plane sees wall time (records carry the wall arrival time).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from controlplane.core.blockhash import ROOT_PARENT, chain_keys, to_hex
from controlplane.sim.engine import GONE, PLANNED, SERVING, WARMING
from controlplane.sim.policies import make_policy
from controlplane.sim.scenarios import Setup
from controlplane.sim.virtual.control import Operator, RecordPoster
from controlplane.sim.virtual.endpoints import Endpoints
from controlplane.sim.virtual.engine import VirtualEngine
from controlplane.sim.virtual.publisher import KvEventPublisher
from controlplane.sim.virtual.tokens import TokenBook
from controlplane.sim.workloads.base import BLOCK_TOKENS

log = logging.getLogger(__name__)
LIFECYCLE_OF = {PLANNED: "draining", WARMING: "warming", SERVING: "serving", GONE: "draining"}
# Names engines report: the cost-model preset is found again from the "8b"/"70b" in them.
MODEL_NAMES = {
    "llama3-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama3-70b": "meta-llama/Llama-3.1-70B-Instruct",
}
HOUSEKEEPING_S = 0.5
WARMUP_WAIT_S = 120.0  # wall seconds a warm-up request waits for its prefill before a 400
# A gateway record with the prompt's token ids (what warm-ups need) per tenant at most this
# often (wall seconds), and at most one such record per second overall: they are large.
TOKEN_RECORD_EVERY_S = 10.0
UTIL_WINDOW_S = 30.0  # sim seconds over which engine utilisation (kv_usage) is averaged


@dataclass
class Options:
    control_plane_url: str
    gateway_token: str
    workdir: Path
    operator_token: str = ""  # needed when engines join (lifecycle changes) and to wait for agents
    time_scale: float = 1.0  # sim seconds per wall second
    payload_bytes: int = 64 * 1024  # bytes a block file really holds (see engine.py)
    bind_host: str = "127.0.0.1"  # where the publishers and HTTP endpoints listen
    advertise_host: str = "127.0.0.1"  # how agents reach them
    base_port: int = 0  # publishers on base_port + 2i, + 2i + 1; 0 picks free ports
    http_port: int = 0
    agent_listen_host: str = "127.0.0.1"
    agent_advertise: str = "127.0.0.1"  # host agents advertise for transfers; "{node}" allowed
    agent_base_port: int = 0  # agent transfer ports; 0 picks free ports
    record_flush_s: float = 1.0
    loop: bool = False  # start the workload again when it ends
    node_prefix: str = "vc-node"


@dataclass
class _Warmup:
    """A warm-up request waiting for its engine's prefill (sim time ``ready_at``)."""

    engine: int
    tokens: list[int]
    keys: tuple[int, ...] = ()
    cached: int = 0
    ready_at: float = math.inf
    reply: dict[str, Any] | None = None
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class Stats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    copies_in_blocks: int = 0
    copies_in_bytes: int = 0
    copies_rejected: int = 0
    replicas_placed: int = 0
    warmups: int = 0
    lifecycle_changes: list[tuple[str, str]] = field(default_factory=list)


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
        self._warmups: queue.Queue[_Warmup] = queue.Queue()
        self._prefilling: list[_Warmup] = []
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
                    self.node_dir(e.eid) / "blocks",
                    options.payload_bytes,
                    pub,
                )
            )
        self.stats = Stats()
        self.stop_event = threading.Event()
        self.started_at: float | None = None
        self.sim_now = 0.0
        self._poster: RecordPoster | None = None
        self._operator = (
            Operator(options.control_plane_url, options.operator_token)
            if options.operator_token
            else None
        )
        self._engine_pk: dict[str, int] = {}
        self._lifecycle: dict[str, str] = {}
        self._util = [0.0] * len(self.engines)
        self._busy_seen = [0.0] * len(self.engines)
        self._util_t = 0.0
        self._next_rid = 1 << 40  # replica ids for placements; the sim's own count from 0
        self._queries = [0] * len(self.engines)
        self._hits = [0] * len(self.engines)
        self._request_no = 0
        self._publish_endpoints()

    # -- layout -----------------------------------------------------------------------------
    def node_name(self, i: int) -> str:
        return f"{self.opt.node_prefix}-{i}"

    def node_dir(self, i: int) -> Path:
        return self.workdir / self.node_name(i)

    def _adv(self, endpoint: str) -> str:
        return endpoint.replace(f"//{self.opt.bind_host}:", f"//{self.opt.advertise_host}:")

    def agent_configs(self, enrolment_tokens: list[str] | None = None) -> list[Path]:
        """Write one agent TOML per node and return their paths. With ``enrolment_tokens`` each
        file carries its node's token (mode 0600); otherwise the agent's environment must."""
        import socket

        paths = []
        http = f"http://{self.opt.advertise_host}:{self.http.port}"
        cost = self.setup.config.cost
        for ve in self.engines:
            i = ve.sim.eid
            node = self.node_name(i)
            if self.opt.agent_base_port:
                port = self.opt.agent_base_port + i
            else:
                with socket.socket() as s:
                    s.bind((self.opt.agent_listen_host, 0))
                    port = s.getsockname()[1]
            adv = self.opt.agent_advertise.replace("{node}", node)
            uuids = [f"GPU-{node}-{g}" for g in range(cost.gpus)]
            text = "\n".join(
                [
                    f'control_plane_url = "{self.opt.control_plane_url}"',
                    f'hostname = "{node}"',
                    *(
                        [f'enrolment_token = "{enrolment_tokens[i]}"']
                        if enrolment_tokens and i < len(enrolment_tokens)
                        else []
                    ),
                    f'state_dir = "{self.node_dir(i) / "state"}"',
                    'labels = { virtual = "true" }',
                    "report_interval_s = 1.0",
                    "engine_metrics_interval_s = 2.0",
                    'metrics_listen = ""',
                    'gpu_source = "simulated"',
                    f'gpu_sim_source = "{http}/nodes/{node}/gpus"',
                    "",
                    "[transfer]",
                    f'listen = "{self.opt.agent_listen_host}:{port}"',
                    f'advertise = "{adv}:{port}"',
                    'block_store = "files"',
                    f'block_store_path = "{ve.store}"',
                    "",
                    "[[engines]]",
                    f'engine_id = "{ve.engine_id}"',
                    f'kv_events = "{self._adv(ve.publisher.endpoint)}"',
                    f'replay = "{self._adv(ve.publisher.replay_endpoint)}"',
                    'topic = "kv"',
                    f'metrics_url = "{http}/engines/{ve.engine_id}/metrics"',
                    f'openai_url = "{http}/engines/{ve.engine_id}"',
                    f'model = "{self.model}"',
                    f"block_size = {BLOCK_TOKENS}",
                    f"bytes_per_block = {self.block_bytes}",
                    f"kv_capacity_blocks = {self.setup.config.kv_capacity_blocks}",
                    f"gpu_uuids = [{', '.join(repr(u).replace(chr(39), chr(34)) for u in uuids)}]",
                    "",
                ]
            )
            path = self.node_dir(i) / "agent.toml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(text)
            paths.append(path)
        return paths

    # -- control plane ----------------------------------------------------------------------
    def wait_for_agents(self, timeout_s: float = 120.0) -> bool:
        """Wait until every engine appears in the control plane (its agent enrolled and
        reported). Needs the operator token; without it, returns True at once."""
        if self._operator is None:
            return True
        want = {(self.node_name(ve.sim.eid), ve.engine_id) for ve in self.engines}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stop_event.is_set():
            try:
                seen = self._operator.engines()
            except Exception as exc:  # the control plane may still be starting
                log.info("waiting for the control plane: %s", exc)
                seen = {}
            if want <= set(seen):
                self._engine_pk = {eng: seen[(node, eng)]["id"] for node, eng in want}
                self._lifecycle = {eng: seen[(node, eng)]["lifecycle"] for node, eng in want}
                return True
            time.sleep(0.5)
        return False

    def _sync_lifecycles(self) -> None:
        if self._operator is None or not self._engine_pk:
            return
        for ve in self.engines:
            want = LIFECYCLE_OF[ve.sim.state]
            have = self._lifecycle.get(ve.engine_id)
            if have == want:
                continue
            steps = [want]
            if have == "serving" and want == "warming":
                steps = ["draining", "warming"]  # serving -> warming goes through draining
            try:
                for s in steps:
                    self._operator.set_lifecycle(
                        self._engine_pk[ve.engine_id], s, f"virtual cluster: engine {ve.sim.state}"
                    )
            except Exception as exc:
                log.warning("%s", exc)
                continue
            self._lifecycle[ve.engine_id] = want
            self.stats.lifecycle_changes.append((ve.engine_id, want))
            log.info("%s is now %s", ve.engine_id, want)

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
        self._forget([k for k in evicted if not any(k in x.cache for x in sim.engines)])
        st = self.stats
        st.requests += 1
        st.prompt_tokens += total
        st.cached_tokens += cached
        st.ttft.append(wait + service)
        self._queries[e.eid] += total
        self._hits[e.eid] += cached
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
            "engine": f"{self.node_name(e.eid)}/{ve.engine_id}",
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

    def _forget(self, keys: list[int]) -> None:
        if keys:
            self.book.forget(keys)

    def _wall_of(self, t: float) -> float:
        assert self.started_at is not None
        return self.started_at + t / self.opt.time_scale

    # -- warm-ups (the ``warmup`` executor's prefill-only requests) ---------------------------
    def warmup_request(self, engine_id: str, req: dict[str, Any]) -> dict[str, Any]:
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
        w = _Warmup(ve.sim.eid, prompt)
        self._warmups.put(w)
        if not w.done.wait(WARMUP_WAIT_S) or w.reply is None:
            raise ValueError(w.error or f"the prefill did not finish within {WARMUP_WAIT_S:.0f}s")
        return w.reply

    def serve_warmups(self, now: float) -> None:
        """Start queued warm-ups (each takes the cost model's prefill time on its engine, after
        the work already queued there) and finish those whose prefill is done: their blocks
        join the engine's cache as any request's do, and are published as KV events."""
        while True:
            try:
                w = self._warmups.get_nowait()
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
            self._prefilling.append(w)
        left = []
        for w in self._prefilling:
            if w.ready_at > now:
                left.append(w)
                continue
            ve = self.engines[w.engine]
            before = set(ve.sim.cache.blocks)
            evicted = ve.sim.cache.use(w.keys, w.ready_at)
            ve.publish_changes(before, w.keys)
            self._forget([k for k in evicted if not any(k in x.cache for x in self.sim.engines)])
            self.stats.warmups += 1
            self._queries[w.engine] += len(w.tokens)
            self._hits[w.engine] += w.cached
            w.reply = {
                "id": f"cmpl-warmup-{self.stats.warmups}",
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
            w.done.set()
        self._prefilling = left

    # -- copies -----------------------------------------------------------------------------
    def apply_store_changes(self, t: float) -> None:
        """Blocks copied in by agents join their engine's cache; evicted ones leave it."""
        for ve in self.engines:
            arrived, vanished = ve.scan_store()
            cache = ve.sim.cache
            if vanished:
                before = set(cache.blocks)
                cache.remove(vanished, t)
                ve.publish_changes(before, [])
            if not arrived:
                continue
            if ve.sim.state == GONE:
                continue
            for chain in self._chains(arrived):
                before = set(cache.blocks)
                rid = self._next_rid
                self._next_rid += 1
                if not cache.place(chain, t, rid, speculative=True):
                    # No free or speculative room: the engine makes room as an allocation does.
                    cache.place(chain, t, rid, speculative=False)
                ve.publish_changes(before, chain)
                placed = sum(1 for k in chain if k in cache.blocks and k not in before)
                self.stats.replicas_placed += 1 if placed else 0
                self.stats.copies_in_blocks += len(chain)
            self.stats.copies_in_bytes = sum(x.copy_bytes_in for x in self.engines)
            self.stats.copies_rejected = sum(x.bad_copies for x in self.engines)

    def _chains(self, keys: list[int]) -> list[tuple[int, ...]]:
        """Arrived keys grouped into chains (root first) by their prefix of origin."""
        by_ns: dict[int, list[tuple[int, int]]] = {}
        for k in keys:
            ns, b, _ = self.book.origin[k]
            by_ns.setdefault(ns, []).append((b, k))
        return [tuple(k for _, k in sorted(v)) for v in by_ns.values()]

    # -- what the agents read ---------------------------------------------------------------
    def _publish_endpoints(self) -> None:
        cost = self.setup.config.cost
        gpu = cost.gpu
        dt = self.sim_now - self._util_t
        for ve in self.engines:
            e = ve.sim
            i = e.eid
            if dt > 0:
                inst = min(1.0, (e.busy_s - self._busy_seen[i]) / dt)
                a = 1.0 - math.exp(-dt / UTIL_WINDOW_S)
                self._util[i] += a * (inst - self._util[i])
                self._busy_seen[i] = e.busy_s
            util = self._util[i]
            node = self.node_name(i)
            kv_pool = self.setup.config.kv_capacity_blocks * self.block_bytes / cost.gpus
            weights = cost.model.weight_bytes / cost.gpus
            running = e.state == SERVING and e.free_at > self.sim_now
            gpus = [
                {
                    "uuid": f"GPU-{node}-{g}",
                    "index": g,
                    "name": f"{gpu.name.upper()} (virtual)",
                    "memory_total": int(gpu.hbm_bytes),
                    "memory_used": int(min(gpu.hbm_bytes, weights + kv_pool))
                    if e.state != PLANNED
                    else 0,
                    "utilization_gpu": round(100 * util),
                    "nvlink_peers": [],
                    "processes": [],
                }
                for g in range(cost.gpus)
            ]
            self.http.set_gpus(
                node, {"gpus": gpus, "status": f"{cost.gpus} virtual GPU(s), engine {e.state}"}
            )
            mean_service = (e.busy_s / e.served) if e.served else 1.0
            waiting = max(0, math.ceil(e.wait(self.sim_now) / mean_service) - 1) if running else 0
            self.http.set_metrics(
                ve.engine_id,
                {
                    "running": 1 if running else 0,
                    "waiting": waiting,
                    "kv_usage": round(util, 4),
                    "queries": self._queries[i],
                    "hits": self._hits[i],
                },
                self.model,
            )
        if dt > 0:
            self._util_t = self.sim_now

    # -- the loop ---------------------------------------------------------------------------
    def run(self, duration_s: float | None = None, wait_for_agents_s: float = 120.0) -> Stats:
        """Replay in real time until the workload ends (or ``duration_s`` wall seconds pass,
        or ``stop()``); with ``options.loop`` the workload starts again when it ends."""
        if not self.wait_for_agents(wait_for_agents_s):
            raise TimeoutError("the agents' engines did not appear in the control plane")
        self._poster = RecordPoster(
            self.opt.control_plane_url, self.opt.gateway_token, self.opt.record_flush_s
        ).start()
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
                if wall >= next_house:
                    self.sim.events.run_until(now)
                    self._sync_lifecycles()
                    self.apply_store_changes(now)
                    self.serve_warmups(now)
                    self._publish_endpoints()
                    next_house = wall + HOUSEKEEPING_S
                nxt = (offset + times[i]) / scale if i < n else math.inf
                delay = min(nxt, next_house) - (time.monotonic() - t0)
                if delay > 0:
                    self.stop_event.wait(min(delay, HOUSEKEEPING_S))
        finally:
            self._poster.close()
        return self.stats

    def stop(self) -> None:
        self.stop_event.set()

    def summary(self) -> dict[str, Any]:
        st = self.stats
        ttft = np.asarray(st.ttft) if st.ttft else np.zeros(1)
        used = sum(
            1
            for ve in self.engines
            for rid, u in ve.sim.cache.replica_used.items()
            if rid >= 1 << 40 and u
        )
        return {
            "engines": len(self.engines),
            "model": self.model,
            "time_scale": self.opt.time_scale,
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
            "replicas_used": used,
            "lifecycle_changes": st.lifecycle_changes,
        }

    def close(self) -> None:
        self.stop_event.set()
        for w in [*self._prefilling, *list(self._warmups.queue)]:
            w.error = "the virtual cluster stopped"
            w.done.set()
        for ve in self.engines:
            ve.publisher.close()
        self.http.close()
        if self._operator:
            self._operator.close()
        self.zmq.term()
