"""The running agent: wires GPU source, engine subscribers, reporter, jobs and transfers."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import zmq

from nodeagent.blockstore import BlockStore, FileBlockStore, MemoryBlockStore
from nodeagent.config import NEEDS_LISTEN, AgentConfig, enabled_transports, listens_everywhere
from nodeagent.config import transport_names as configured_transports
from nodeagent.engine_metrics import scrape
from nodeagent.engine_residency import EngineResidency
from nodeagent.gpu import GpuSource, make_gpu_source
from nodeagent.jobs import JobChannel, JobRunner, Journal
from nodeagent.metrics import AgentMetrics
from nodeagent.records import RecordSpool
from nodeagent.reporter import Reporter
from nodeagent.retry import Backoff
from nodeagent.subscriber import EngineSubscriber
from nodeagent.tap import RequestTap, TapThread
from nodeagent.transfers.base import Background, Executor
from nodeagent.transfers.lmcache import LmcacheTransport
from nodeagent.transfers.lmcache_mp import LmcacheMpTransport
from nodeagent.transfers.nccl import NcclTransport
from nodeagent.transfers.tcp import TcpTransferServer, TcpTransport
from nodeagent.transfers.warmup import WarmupTransport
from wire import protocol
from wire.blockhash import to_hex
from wire.protocol import KEY_MAX

log = logging.getLogger(__name__)


def make_block_store(cfg: AgentConfig) -> BlockStore:
    t = cfg.transfer
    if t.block_store == "files":
        return FileBlockStore(t.block_store_path)
    return MemoryBlockStore(t.block_store_max_bytes, pinned=t.block_store == "pinned")


class Agent:
    def __init__(
        self, cfg: AgentConfig, gpu_source: GpuSource | None = None, store: BlockStore | None = None
    ):
        self.cfg = cfg
        state = Path(cfg.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        self.metrics = AgentMetrics()
        self.gpu_source = gpu_source or make_gpu_source(cfg.gpu_source, cfg.gpu_sim_source)
        self.store = store or make_block_store(cfg)
        self.residencies = {
            e.engine_id: EngineResidency(e.engine_id, e.block_size) for e in cfg.engines
        }
        self.engine_metrics: dict[str, dict[str, Any]] = {}
        self.engine_config: dict[str, dict[str, str]] = {}  # vLLM's cache_config_info labels
        self.zmq = zmq.Context()
        self.subscribers = [
            EngineSubscriber(
                self.residencies[e.engine_id],
                e.kv_events,
                e.replay,
                e.topic,
                self.zmq,
                on_batch=self._on_batch(e.engine_id),
                socket_mode=e.kv_events_socket,
            )
            for e in cfg.engines
        ]
        self._make_transfers(state)
        self.reporter = self._make_reporter(state)
        # Request taps: records go through their own spool, sent once a report was applied (the
        # control plane knows this node's engines from it).
        self.records = RecordSpool(
            cfg.control_plane_url,
            state / "records",
            lambda: self.reporter.state.agent_token,
            lambda: self.reporter.last_applied_seq is not None,
            interval_s=cfg.report_interval_s,
            max_bytes=cfg.spool_max_bytes,
            backoff=Backoff(cfg.backoff_initial_s, cfg.backoff_max_s),
            timeout_s=cfg.request_timeout_s,
            metrics=self.metrics,
        )
        self.taps = self._make_taps()
        self.tap_thread = TapThread(self.taps) if self.taps else None
        self.taps_by_engine = {t.engine.rpartition("/")[2]: t for t in self.taps}
        self.runner = JobRunner(
            Journal(state / "jobs.journal"),
            self.store,
            self.transports,
            self.metrics,
            cut_report=self.reporter.cut,
        )
        self.channel = JobChannel(
            cfg.control_plane_url,
            lambda: self.reporter.state.agent_token,
            self.runner,
            mode=cfg.jobs_transport,
            long_poll_wait_s=cfg.long_poll_wait_s,
            backoff=Backoff(cfg.backoff_initial_s, cfg.backoff_max_s),
        )
        self._last_gpu_status = ""
        self._counted: dict[str, tuple[int, int]] = {}

    def _make_transfers(self, state: Path) -> None:
        """The enabled transports, their executors, the tcp transfer server and the address
        this node advertises for transfers."""
        cfg, t = self.cfg, self.cfg.transfer
        self.enabled_transports = enabled_transports(t)
        # The transfer server runs only for tcp, on the address the operator named.
        self.server: TcpTransferServer | None = None
        if protocol.TRANSPORT_TCP in self.enabled_transports:
            self.server = TcpTransferServer(t.listen, self.store, t.hash_threads)
        self.transfer_address = ""
        if any(n in NEEDS_LISTEN for n in self.enabled_transports):
            port = self.server.address.rpartition(":")[2] if self.server else ""
            port = port or t.listen.rpartition(":")[2]
            host = t.listen.rpartition(":")[0]
            self.transfer_address = t.advertise or (
                f"{socket.gethostname()}:{port}" if listens_everywhere(t) else f"{host}:{port}"
            )
        available: dict[str, Callable[[], Executor]] = {
            protocol.TRANSPORT_TCP: lambda: TcpTransport(
                self.server, t.rate_limit_bytes_per_s, t.chunk_bytes, t.connect_timeout_s, t.retries
            ),
            protocol.TRANSPORT_NCCL: NcclTransport,
            protocol.TRANSPORT_LMCACHE: lambda: LmcacheTransport(
                {e.engine_id: e for e in cfg.engines},
                cfg.lmcache_controller_url,
                cfg.lmcache_renew_s,
                state / "lmcache-leases.json",
            ),
            protocol.TRANSPORT_WARMUP: lambda: WarmupTransport(
                {e.engine_id: e for e in cfg.engines}
            ),
            protocol.TRANSPORT_LMCACHE_MP: lambda: LmcacheMpTransport(
                {e.engine_id: e for e in cfg.engines}, cfg.lmcache_coordinator_url
            ),
        }
        self.transports = {n: available[n]() for n in self.enabled_transports}

    def _make_reporter(self, state: Path) -> Reporter:
        cfg = self.cfg
        return Reporter(
            cfg.control_plane_url,
            state,
            self.residencies,
            self._gpus,
            self._engines,
            enrolment_token=cfg.enrolment_token,
            hostname=cfg.hostname,
            labels=cfg.labels,
            transports=list(self.transports),
            interval_s=cfg.report_interval_s,
            min_interval_s=cfg.report_min_interval_s,
            heartbeat_s=cfg.heartbeat_interval_s,
            timeout_s=cfg.request_timeout_s,
            backoff_initial_s=cfg.backoff_initial_s,
            backoff_max_s=cfg.backoff_max_s,
            spool_max_bytes=cfg.spool_max_bytes,
            metrics=self.metrics,
        )

    def _make_taps(self) -> list[RequestTap]:
        """A request tap for each engine with ``tap_listen``, feeding the record spool."""
        cfg = self.cfg
        return [
            RequestTap(
                f"{cfg.hostname}/{e.engine_id}",
                e.tap_listen,
                e.openai_url,
                self.records.add,
                e.block_size,
                tenant_rule=cfg.tap_tenant,
                token_ids_every_s=cfg.tap_token_ids_every_s,
                predict=self.residencies[e.engine_id].cached_depth,
            )
            for e in cfg.engines
            if e.tap_listen
        ]

    def _on_batch(self, engine_id: str) -> Callable[[int], None]:
        """What a subscriber thread calls after each KV-event batch: count it, report it soon."""
        count = self.metrics.kv_block_events.labels(engine_id).inc

        def applied(n: int) -> None:
            count(n)
            self.reporter.poke()

        return applied

    def _gpus(self) -> list[dict[str, Any]]:
        reading = self.gpu_source.collect()
        if reading.status != self._last_gpu_status:
            log.info("GPUs: %s", reading.status)
            self._last_gpu_status = reading.status
        self.metrics.gpus.set(len(reading.gpus))
        return reading.gpus

    def _engines(self) -> list[dict[str, Any]]:
        out = []
        for e, sub in zip(self.cfg.engines, self.subscribers, strict=True):
            res = self.residencies[e.engine_id]
            self.metrics.resident_blocks.labels(e.engine_id).set(res.block_count())
            st = sub.tracker.stats
            seen_gaps, seen_resyncs = self._counted.get(e.engine_id, (0, 0))
            self.metrics.kv_gaps.labels(e.engine_id).inc(st.gaps - seen_gaps)
            self.metrics.kv_resyncs.labels(e.engine_id).inc(st.resyncs + st.restarts - seen_resyncs)
            self._counted[e.engine_id] = (st.gaps, st.resyncs + st.restarts)
            out.append(
                {
                    "engine_id": e.engine_id,
                    "kind": e.kind,
                    "model": e.model,
                    "block_size": e.block_size,
                    "bytes_per_block": e.bytes_per_block,
                    "kv_capacity_blocks": e.kv_capacity_blocks,
                    "gpu_uuids": e.gpu_uuids,
                    "endpoints": {
                        "kv_events": e.kv_events,
                        "kv_events_socket": e.kv_events_socket,
                        "replay": e.replay,
                        "metrics": e.metrics_url,
                        "transfer": self.transfer_address,
                        # What executors that act on the engine itself need (docs/agent.md).
                        "openai": e.openai_url,
                        "kv_peer": e.kv_peer,
                        "lmcache_instance_id": e.lmcache_instance_id,
                        "lmcache_location": e.lmcache_location if e.lmcache_instance_id else "",
                        "lmcache_controller": self.cfg.lmcache_controller_url,
                        "lmcache_coordinator": self.cfg.lmcache_coordinator_url,
                    },
                    "metrics": self.engine_metrics.get(e.engine_id, {}),
                    "doctor": self._doctor(e.engine_id, sub, res),
                }
            )
        return out

    def _doctor(self, engine_id: str, sub: EngineSubscriber, res: EngineResidency) -> dict:
        """What the fleet doctor needs to know of one engine that only this agent sees."""
        tap = self.taps_by_engine.get(engine_id)
        return {
            "cache_config": self.engine_config.get(engine_id, {}),
            "topic": sub.topic_seen,
            "subscribed_topic": sub.topic,
            # to 10 s: a report rewrites the engine's row only when something it says changed
            "last_event_at": round(res.last_event_at, -1) or None,
            "replay_answered": None if sub.replay is None else sub.replay.answered,
            "event_block_size": res.event_block_size or None,
            "roots": {to_hex(k): to_hex(h & KEY_MAX) for k, h in list(res.roots.items())},
            "tap": tap.window.counts(time.time()) if tap else None,
        }

    async def _scrape_loop(self) -> None:
        targets = [(e.engine_id, e.metrics_url) for e in self.cfg.engines if e.metrics_url]
        if not targets:
            return
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                for engine_id, url in targets:
                    got = await scrape(client, url)
                    if got is not None:
                        self.engine_config[engine_id] = got.pop("cache_config", {})
                        self.engine_metrics[engine_id] = got
                await asyncio.sleep(self.cfg.engine_metrics_interval_s)

    async def run(self, stop: asyncio.Event) -> None:
        if self.cfg.metrics_listen:
            self.metrics.serve(self.cfg.metrics_listen)
        for sub in self.subscribers:
            sub.start()
        off = [
            n for n in configured_transports(self.cfg.transfer) if n not in self.enabled_transports
        ]
        if off:
            log.warning(
                "transports %s are off: transfer.listen is not set (name this node's private "
                "address, docs/security.md)",
                ", ".join(off),
            )
        if self.server:
            self.server.start()
            if listens_everywhere(self.cfg.transfer):
                log.warning(
                    "transfer server listens on every interface (%s): bind it to the private "
                    "network's address instead (docs/security.md)",
                    self.cfg.transfer.listen,
                )
            log.info(
                "transfer server on %s (advertised %s)", self.server.address, self.transfer_address
            )
        self.runner.loop = asyncio.get_running_loop()
        # Executors with work of their own (the lmcache executor's lease renewals) start with
        # the agent; an agent without that transport has none of it.
        for executor in self.transports.values():
            if isinstance(executor, Background):
                executor.start(self.runner.notify)
        tasks = [asyncio.create_task(self.reporter.run()), asyncio.create_task(self._scrape_loop())]
        if self.tap_thread:
            self.tap_thread.start()
            tasks.append(asyncio.create_task(self.records.run()))
        if self.cfg.jobs_transport != "none":
            tasks.append(asyncio.create_task(self.channel.run()))
        await stop.wait()
        log.info("stopping (%d running job(s))", len(self.runner.running))
        # Running jobs first: aborted, their results recorded and sent while the channel is up.
        await self.runner.stop(self.cfg.stop_timeout_s)
        self.reporter.stop_event.set()
        self.channel.stop_event.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.tap_thread:
            self.tap_thread.stop()  # first: what the taps saw reaches the record spool
        await self.reporter.aclose()
        await self.records.aclose()
        for executor in self.transports.values():
            if isinstance(executor, Background):
                executor.stop()
        for sub in self.subscribers:
            sub.stop()
        if self.server:
            self.server.close()
        self.gpu_source.close()
        log.info("stopped")


def run_agent(cfg: AgentConfig) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await Agent(cfg).run(stop)

    asyncio.run(main())
    return 0
