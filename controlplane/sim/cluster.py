"""The cluster model and the replay loop.

``ClusterConfig`` describes the hardware (engines, KV capacity, links, tiers, engines that join
or leave); ``Simulation`` replays one workload under one policy and returns ``RunResult``.

Links: each engine has one network link. A copy occupies the source's and the target's links
for ``bytes / bandwidth``; links between engines of one node use NVLink, others the network.
With ``link_share_with_serving`` > 0 the network also carries serving traffic in proportion to
the cluster's recent load, so a copy made during a burst is slower than one made before it.

Copies have two priorities on a link, as a transfer engine with priority queues gives them:
on-demand copies (the reactive rule's) queue only behind other on-demand copies; a speculative
copy in flight on either link is paused while an on-demand copy passes, so its landing moves
back by the on-demand copy's duration. Speculation therefore never delays an on-demand copy.

Speculative VRAM: each engine's cache holds speculative blocks in a bounded slice
(``spec_fraction`` of its KV capacity; ``warming_spec_fraction`` while it is joining and holds
nothing else). A copy takes free blocks, then cached blocks that no queued or running request
references, cheapest first by the policy's expected value (``controlplane.core.prefix_cache``);
a speculative copy is not started when the target has no such room within its slice; unused
speculative blocks are evicted before any normal block when a request needs room.
"""

from __future__ import annotations

import math
import time

import numpy as np

from controlplane.core.costmodel import transfer_s
from controlplane.core.prefix_cache import PrefixCache
from controlplane.sim.config import (  # noqa: F401 - the cluster model, re-exported
    ClusterConfig,
    EngineChange,
    Replica,
    RunResult,
    TierSpec,
)
from controlplane.sim.engine import GONE, PLANNED, SERVING, WARMING, Engine, OffloadTier
from controlplane.sim.events import EventQueue
from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload

LOAD_WINDOW_S = 60.0  # time constant of the cluster-load average that link sharing uses


SUFFIX_BASE = 1 << 63  # a request's own suffix blocks: keys above every prefix's


class Simulation:
    """Replays ``workload`` on the cluster under ``policy`` (see ``controlplane.sim.policies``)."""

    def __init__(self, config: ClusterConfig, workload: Workload, policy, seed: int = 0) -> None:
        self.config = config
        self.workload = workload
        self.policy = policy
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.cost = config.cost
        f = self.cost.flops_per_s
        m = self.cost.model
        # prefill(new, cached) = over + dense * new + attn * new * (cached + new / 2)
        self._over = self.cost.batch_overhead_s
        self._dense = 2.0 * m.params / f
        self._attn = 4.0 * m.layers * m.d_model / f
        self.block_bytes = config.block_bytes
        self.events = EventQueue()
        self.engines: list[Engine] = []
        for eid in range(config.engines):
            tiers = [
                OffloadTier(t.name, PrefixCache(t.capacity_blocks), t.bytes_per_s)
                for t in config.tiers
            ]
            self.engines.append(
                Engine(
                    eid,
                    eid // max(1, config.engines_per_node),
                    PrefixCache(config.kv_capacity_blocks),
                    tiers,
                )
            )
        for ch in config.changes:
            if not 0 <= ch.eid < config.engines:
                raise ValueError(f"engine change for unknown engine {ch.eid}")
            e = self.engines[ch.eid]
            if ch.serve_s > 0:
                e.state = PLANNED
                self.events.at(ch.announce_s, lambda t, e=e: self._set_state(e, WARMING))  # type: ignore[misc]
                self.events.at(ch.serve_s, lambda t, e=e: self._set_state(e, SERVING, t))  # type: ignore[misc]
            if not math.isinf(ch.leave_s):
                self.events.at(ch.leave_s, lambda t, e=e: self._set_state(e, GONE))  # type: ignore[misc]
        for e in self.engines:
            self._spec_slice(e)
        self.serving = [e for e in self.engines if e.state == SERVING]
        for e in self.serving:
            e.serving_since = -math.inf  # serving from the start: not ramping in
        if not self.serving:
            raise ValueError("no engine serves at t=0")
        self.bytes_moved = 0.0
        self.replicas: list[Replica] = []
        self.in_flight: dict[tuple[int, int], float] = {}  # (pid, engine) -> land time
        self.demand_in_flight: set[tuple[int, int]] = set()  # the on-demand ones among them
        self.spec_lands: dict[int, float] = {}  # speculative copy in flight -> land time
        self.spec_links: dict[int, tuple[Engine, Engine, list[int]]] = {}
        self._load_work = 0.0  # exponentially decayed prefill seconds
        self._load_t = 0.0
        self.now = 0.0

    # -- cluster state ---------------------------------------------------------------------
    def _set_state(self, e: Engine, state: str, now: float = 0.0) -> None:
        e.state = state
        if state == SERVING:
            e.serving_since = now
        self._spec_slice(e)
        self.serving = [x for x in self.engines if x.state == SERVING]

    def rejoin(self, offset: float) -> list[tuple[Engine, list[int]]]:
        """Play ``config.changes`` again from ``offset`` (a looped workload's next pass): each
        engine that joined is taken out now, back to planned with an empty cache (a scale-in
        ends its process), and is announced and serves again at the same points of the pass.
        Returns those engines, each with the keys its cache held."""
        out = []
        for ch in self.config.changes:
            if ch.serve_s <= 0:
                continue
            e = self.engines[ch.eid]
            self._set_state(e, PLANNED)
            held = e.cache.clear(offset)
            a, s = offset + ch.announce_s, offset + ch.serve_s
            self.events.at(a, lambda t, e=e: self._set_state(e, WARMING))  # type: ignore[misc]
            self.events.at(s, lambda t, e=e: self._set_state(e, SERVING, t))  # type: ignore[misc]
            out.append((e, held))
        return out

    def _spec_slice(self, e: Engine) -> None:
        # Warm-up copies already on a joining engine stay when it starts serving (they are
        # evicted first); the smaller slice only bounds new speculative placements.
        frac = (
            self.config.spec_fraction if e.state == SERVING else self.config.warming_spec_fraction
        )
        e.cache.spec_limit = int(frac * e.cache.capacity)

    def prefill_s(self, new: float, cached: float) -> float:
        return self._over + new * (self._dense + self._attn * (cached + 0.5 * new))

    def load(self, now: float) -> float:
        """Recent utilisation of the serving engines (0..1), a 60 s exponential average.

        Normalised by the decayed time observed so far (``W (1 - exp(-t / W))``, at least 1 s),
        so the estimate is unbiased from t = 0: at the start of a run it reads the load of the
        seconds seen, not a fraction of it (the planner's load gate used to be open in the first
        minute of every run)."""
        work = self._load_work * math.exp(-(now - self._load_t) / LOAD_WINDOW_S)
        seen = max(1.0, -LOAD_WINDOW_S * math.expm1(-max(0.0, now) / LOAD_WINDOW_S))
        return min(1.0, work / (seen * max(1, len(self.serving))))

    def _add_work(self, now: float, seconds: float) -> None:
        self._load_work = (
            self._load_work * math.exp(-(now - self._load_t) / LOAD_WINDOW_S) + seconds
        )
        self._load_t = now

    def link_bytes_per_s(self, src: Engine, dst: Engine, now: float) -> float:
        if src.node == dst.node:
            return self.cost.gpu.nvlink_bytes_per_s * self.cost.gpus
        share = self.config.link_share_with_serving
        return self.config.network_bytes_per_s * max(0.05, 1.0 - share * self.load(now))

    def copy_eta(
        self, src: Engine, dst: Engine, nbytes: float, now: float, speculative: bool = True
    ) -> float:
        """When a copy started now would land. A speculative copy queues behind every copy on
        either link; an on-demand one only behind on-demand copies (it pauses speculation)."""
        if speculative:
            start = max(now, src.link_free_at, dst.link_free_at)
        else:
            start = max(now, src.demand_free_at, dst.demand_free_at)
        bw = self.link_bytes_per_s(src, dst, start)
        return start + transfer_s(nbytes, bw, self.config.link_latency_s)

    def start_copy(
        self,
        pid: int,
        keys: tuple[int, ...],
        src: Engine,
        dst: Engine,
        now: float,
        speculative: bool,
        ttl_s: float = math.inf,
        value_of=None,
        budget: float = math.inf,
        keep_s: float = 0.0,
    ) -> float | None:
        """Copy ``keys`` from ``src`` to ``dst``; returns the landing time (None: nothing to do).

        The copy takes room as ``PrefixCache.place`` does: free blocks, then blocks no queued
        or running request references, cheapest by ``value_of`` first, displacing less than
        ``budget`` of expected value. A speculative copy, or an on-demand one given a
        ``budget``, is not started (moves no bytes) when the target has no such room."""
        missing = [k for k in keys if k not in dst.cache.blocks and k not in dst.pending]
        if not missing or dst.state == GONE or (pid, dst.eid) in self.in_flight:
            return None
        if speculative or budget != math.inf:
            dst.refresh_busy(now)
            if speculative:
                room = dst.cache.spec_room(value_of, budget)
            else:
                room = dst.cache.free + len(dst.cache._displaceable(value_of, budget, set(keys)))
            if len(missing) > room:
                return None  # no room worth less than the copy: do not move the bytes
        nbytes = len(missing) * self.block_bytes
        land = self.copy_eta(src, dst, nbytes, now, speculative)
        rid = len(self.replicas)
        if speculative:
            src.link_free_at = dst.link_free_at = land
        else:
            start = max(now, src.demand_free_at, dst.demand_free_at)
            src.demand_free_at = dst.demand_free_at = land
            self._pause_speculation((src, dst), start, land - start)
            for e in (src, dst):
                e.link_free_at = max(e.link_free_at, land)
        self.bytes_moved += nbytes
        self.replicas.append(Replica(rid, pid, dst.eid, speculative, land, nbytes))
        for k in missing:
            dst.pending[k] = land
        self.in_flight[(pid, dst.eid)] = land
        if not speculative:
            self.demand_in_flight.add((pid, dst.eid))
        if speculative:
            self.spec_lands[rid] = land
            self.spec_links[rid] = (src, dst, missing)

        def landed(t: float) -> None:
            later = self.spec_lands.get(rid, t)
            if later > t:  # paused by on-demand copies: lands later
                self.events.at(later, landed)
                return
            self.spec_lands.pop(rid, None)
            self.spec_links.pop(rid, None)
            for k in missing:
                dst.pending.pop(k, None)
            self.in_flight.pop((pid, dst.eid), None)
            self.demand_in_flight.discard((pid, dst.eid))
            if dst.state != GONE:
                dst.refresh_busy(t)
                dst.cache.place(keys, t, rid, speculative, t + ttl_s, value_of, budget, t + keep_s)

        self.events.at(land, landed)
        return land

    def _pause_speculation(self, links, start: float, seconds: float) -> None:
        """Speculative copies in flight on ``links`` after ``start`` yield ``seconds``."""
        if not self.spec_lands or seconds <= 0:
            return
        busy = set(links)
        for rid, (a, b, keys) in self.spec_links.items():
            land = self.spec_lands[rid]
            if land > start and (a in busy or b in busy):
                land += seconds
                self.spec_lands[rid] = land
                for k in keys:
                    b.pending[k] = land
                self.in_flight[(self.replicas[rid].pid, b.eid)] = land
                for e in (a, b):
                    e.link_free_at = max(e.link_free_at, land)

    def promote(self, e: Engine, keys: tuple[int, ...], now: float, ttl_s: float) -> float | None:
        """Prefetch ``keys`` from e's lower tiers into its HBM (a speculative placement)."""
        m, lower = e.match(keys, now)
        if not lower:
            return None
        seconds = sum(k * self.block_bytes / tier.bytes_per_s for tier, k in lower)
        n = m + sum(k for _, k in lower)
        chain = keys[:n]
        e.refresh_busy(now)
        if n - m > e.cache.spec_room():
            return None  # the speculative slice is full: leave it on the lower tier
        land = now + seconds
        rid = len(self.replicas)
        self.replicas.append(Replica(rid, -1, e.eid, True, land, (n - m) * self.block_bytes))
        for k in chain[m:]:
            e.pending[k] = land

        def landed(t: float) -> None:
            for k in chain[m:]:
                e.pending.pop(k, None)
            e.refresh_busy(t)
            if e.state != GONE and e.cache.place(chain, t, rid, True, t + ttl_s):
                for tier in e.tiers:
                    tier.cache.remove(chain[m:], t)

        self.events.at(land, landed)
        return land

    # -- the replay ------------------------------------------------------------------------
    def run(self, progress=None) -> RunResult:
        wl = self.workload
        policy = self.policy
        policy.setup(self)
        n = len(wl)
        ttft = np.empty(n)
        cached_tok = np.empty(n, dtype=np.int64)
        input_tok = np.empty(n, dtype=np.int64)
        engine_of = np.empty(n, dtype=np.int32)
        prefixes = wl.prefixes
        times = wl.t.tolist()
        pids = wl.pid.tolist()
        suffixes = wl.suffix_tokens.tolist()
        self.suffixes = suffixes
        route = policy.route
        before = policy.before_route
        on_miss = self._watch_misses()
        self._next_tick = 0.0 if policy.tick_s else math.inf
        sample_every = max(1.0, wl.duration_s / 200.0) if wl.duration_s else 10.0
        next_sample = 0.0
        samples: list[dict] = []
        wall0 = time.perf_counter()
        for i in range(n):
            t = times[i]
            self._advance_to(t)
            if t >= next_sample:
                samples.append(self._sample(t))
                next_sample = t + sample_every
            pid = pids[i]
            keys = prefixes[pid]
            if before is not None:
                before(self, i, t, pid, keys)
            e, m, promo_s, lower = route(self, i, t, keys)
            cached, input_tok[i], ttft[i] = self._serve(e, t, keys, suffixes[i], m, promo_s, lower)
            cached_tok[i] = cached
            engine_of[i] = e.eid
            if not cached and on_miss is not None:
                on_miss(self, e, pid, keys, t)
            self._store(e, i, t, keys, suffixes[i], m, lower)
            if progress is not None and i % 4096 == 0:
                progress(i, n)
        last = times[-1] if times else 0.0
        backlog = sum(e.wait(last) for e in self.serving) / max(1, len(self.serving))
        end = max(last, wl.duration_s)
        self.events.run_until(end)
        samples.append(self._sample(end))
        if progress is not None:
            progress(n, n)
        arrays = (ttft, cached_tok, input_tok, engine_of)
        return self._result(end, arrays, samples, backlog, time.perf_counter() - wall0)

    def _watch_misses(self):
        """A policy that watches misses (the harm guard's feed) is told of each request served
        with nothing of its prefix cached, before serving it changes the engine's cache; the
        engines then keep when they last removed each prefix's first block. Its hook, or None."""
        on_miss = getattr(self.policy, "on_miss", None)
        if on_miss is not None:
            roots = {p[0] for p in self.workload.prefixes if p}
            for x in self.engines:
                x.cache.watch(roots)
        return on_miss

    def _advance_to(self, t: float) -> None:
        """Run the policy's ticks and the scheduled events due by ``t``, in time order."""
        events, tick = self.events, self.policy.tick_s
        while self._next_tick <= t or events.next_time() <= t:
            if self._next_tick <= events.next_time():
                self.now = self._next_tick
                self.policy.on_tick(self, self._next_tick)
                self._next_tick += tick
            else:
                events.run_until(min(t, self._next_tick - 1e-12))
        self.now = t

    def _serve(self, e, t: float, keys, suffix: int, m: int, promo_s: float, lower):
        """Queue the request on ``e`` (FIFO prefill): (tokens cached, tokens in, its TTFT)."""
        total = len(keys) * BLOCK_TOKENS + suffix
        cached = (m + sum(k for _, k in lower)) * BLOCK_TOKENS if lower else m * BLOCK_TOKENS
        wait = e.free_at - t if e.free_at > t else 0.0
        service = self.prefill_s(total - cached, cached)
        if promo_s > wait:
            service += promo_s - wait  # loading from a lower tier overlaps the queue
        e.free_at = t + wait + service
        e.queue.append((t, e.free_at))
        e.busy_s += service
        e.served += 1
        self._add_work(t, service)
        return cached, total, wait + service

    def _store(self, e, i: int, t: float, keys, suffix: int, m: int, lower) -> None:
        """The request's blocks cached on ``e`` (those promoted leave their lower tier; what
        the policy evicts is demoted)."""
        # Full suffix blocks are the request's own: unique keys, cached like any block.
        own = suffix // BLOCK_TOKENS
        chain = keys if not own else keys + tuple(SUFFIX_BASE | (i << 8) | j for j in range(own))
        if lower:
            done = m
            for tier, k in lower:
                tier.cache.remove(keys[done : done + k], t)
                done += k
        evicted = self.policy.use(self, e, chain, t)
        if evicted and e.tiers:
            e.demote(evicted, t)

    def _result(
        self,
        end: float,
        arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        samples,
        backlog: float,
        wall_s: float,
    ) -> RunResult:
        spec_bs = 0.0
        used: dict[int, bool] = {}
        for e in self.engines:
            e.cache.finish(end)
            spec_bs += e.cache.spec_block_seconds
            used.update(e.cache.replica_used)
        policy, wl = self.policy, self.workload
        ttft, cached_tok, input_tok, engine_of = arrays
        return RunResult(
            policy.name,
            ttft,
            cached_tok,
            input_tok,
            engine_of,
            self.bytes_moved,
            spec_bs * self.block_bytes,
            self.replicas,
            used,
            wall_s,
            samples,
            getattr(policy, "forecast_log", {}),
            getattr(policy, "plan_items", 0),
            wl.t,
            backlog,
            getattr(policy, "guard_stats", {}),
            getattr(policy, "ingest_stats", {}),
            getattr(policy, "value_stats", {}),
        )

    def _sample(self, t: float) -> dict:
        spec = sum(len(e.cache.spec) for e in self.engines)
        total = sum(len(e.cache) for e in self.engines if e.state != GONE)
        return {
            "t": t,
            "normal_bytes": (total - spec) * self.block_bytes,
            "spec_bytes": spec * self.block_bytes,
            SERVING: len(self.serving),
            "load": self.load(t),
        }
