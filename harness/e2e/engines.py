"""The engine side of the end-to-end cluster: a node's simulated engine (its vLLM KV-event
publisher and ``/metrics``) and the loader that turns KV an agent copied into the engine's own
KV events (``CopyLoader``): a copy is confirmed by what actually arrived, never by the test."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import msgpack

from harness import burst
from harness.event_publisher import TestPublisher
from harness.processes import Proc
from nodeagent.blockstore import FileBlockStore
from wire import blockhash
from wire.protocol import TIER_GPU


class EngineMetricsServer:
    """The engine's vLLM ``/metrics``: a busy engine (KV 80% used, 12 requests running), as a
    burst finds it; an idle one with ``running=0``."""

    def __init__(self, kv_usage: float = 0.5, running: int = 12):
        self.kv_usage = kv_usage
        self.running = running
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = (
                    f'vllm:kv_cache_usage_perc{{model_name="{burst.MODEL}"}} {outer.kv_usage}\n'
                    f'vllm:num_requests_running{{model_name="{burst.MODEL}"}} {outer.running}\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Node:
    name: str
    publisher: TestPublisher
    store_dir: Path
    metrics_port: int
    transfer_port: int
    engine_metrics: EngineMetricsServer
    proc: Proc | None = None
    seq: int = 0
    loader: CopyLoader | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # one publisher, two threads

    def _hash(self, key: int) -> int:
        return hash((self.name, key)) & (2**63 - 1)  # the engine's own block hash

    def _publish(self, event: list) -> None:
        with self.lock:
            self.seq += 1
            self.publisher.publish(b"kv", self.seq, msgpack.packb([time.time(), [event], 0]))

    def publish_stored(self, tokens: list[int], block_size: int = burst.BLOCK) -> list[int]:
        """The engine stores a chain (vLLM's positional BlockStored); returns its canonical keys."""
        keys = blockhash.chain_keys(tokens, block_size)
        hashes = [self._hash(k) for k in keys]
        self._publish(["BlockStored", hashes, None, tokens, block_size, None, TIER_GPU])
        return keys

    def publish_removed(self, keys: list[int]) -> None:
        """The engine evicts blocks (vLLM's positional BlockRemoved)."""
        self._publish(["BlockRemoved", [self._hash(k) for k in keys], TIER_GPU])

    def metrics(self) -> dict[str, float]:
        """The agent's /metrics as {'name{labels}': value}; {} while it is down."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return {}
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


class CopyLoader(threading.Thread):
    """A target engine's side of a copy: it loads the burst prefix's blocks that its agent
    wrote into its block store, from the chain's root, each only if its bytes are the source's
    (what the copy had to move), and then publishes them in its KV events, as vLLM does once its
    connector loaded external KV; blocks that leave the store (an evict job) it publishes as
    removed. What the control plane confirms is therefore what the agent really copied."""

    def __init__(self, node: Node, source_bytes: dict[int, bytes], interval_s: float = 0.1):
        super().__init__(name=f"copy-loader-{node.name}", daemon=True)
        self.node, self.source_bytes, self.interval_s = node, source_bytes, interval_s
        self.store = FileBlockStore(node.store_dir)
        self.loaded = 0  # blocks of the prefix, from its root, the engine holds
        self.stop = threading.Event()
        self.loading = threading.Event()  # cleared: the engine loads nothing yet (a test's pause)
        self.loading.set()

    def depth(self) -> int:
        for i, key in enumerate(burst.PREFIX):
            try:
                if bytes(self.store.read(key)) != self.source_bytes[key]:
                    return i
            except (FileNotFoundError, KeyError, ValueError):
                return i
        return len(burst.PREFIX)

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            if not self.loading.is_set():
                continue
            depth = self.depth()
            if depth > self.loaded:
                self.node.publish_stored(burst.PREFIX_TOKENS[: depth * burst.BLOCK])
            elif depth < self.loaded:
                self.node.publish_removed(burst.PREFIX[depth : self.loaded])
            self.loaded = depth
