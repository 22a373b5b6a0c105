"""A KV-event publisher speaking vLLM's ZMQ wire protocol, for virtual engines.

What a real vLLM engine started with ``--kv-events-config '{"publisher": "zmq", ...}'`` does,
written from the protocol (``../shared/data/README.md``), not from vLLM's code:

- PUB socket: each message is three frames ``[topic, seq, payload]``; ``seq`` is 8 bytes
  big-endian, starting at 0 and increasing by one; ``payload`` is a msgpack ``EventBatch``
  ``[ts, events, data_parallel_rank]`` whose events use the newer map encoding
  (``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": ..., "token_ids": [...],
  "block_size": B, "lora_id": None, "medium": "GPU", "lora_name": None}``).
- ROUTER replay socket: a DEALER sends ``[b"", start_seq]`` and gets ``[b"", topic, seq,
  payload]`` for each buffered message with ``seq >= start_seq``, then the end marker
  ``[b"", b"", -1, b""]``. The buffer keeps the last ``buffer_size`` messages (vLLM's
  ``buffer_steps``), and at most ``buffer_bytes`` of them: a virtual engine's batches carry the
  token ids of long prefixes (~15 KB on average in the burst demo), so 10,000 of them held
  ~150 MB per engine, and the demo's virtual cluster grew ~20 MB a minute for most of an hour
  while its six buffers filled. An agent asks for a replay after a gap of a few batches, or
  from 0 when it starts (a history that starts later is applied as it is).

``publish`` must be called from one thread (PUB sockets are not thread-safe); replay requests
are answered by a background thread that owns the ROUTER socket.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq

from wire.protocol import TIER_GPU

END_SEQ = (-1).to_bytes(8, "big", signed=True)
REPLAY_BUFFER_BYTES = 16 << 20  # per engine: ~45 s of the burst demo's busiest engine


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def block_stored(
    block_hashes: Sequence[int],
    parent: int | None,
    token_ids: Sequence[int],
    block_size: int,
    medium: str = TIER_GPU,
) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": list(block_hashes),
        "parent_block_hash": parent,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }


def block_removed(block_hashes: Sequence[int], medium: str = TIER_GPU) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(block_hashes), "medium": medium}


def encode_batch(events: list[dict[str, Any]], ts: float | None = None, dp_rank: int = 0) -> bytes:
    return msgpack.packb([time.time() if ts is None else ts, events, dp_rank], use_bin_type=True)


class KvEventPublisher:
    """PUB + ROUTER replay sockets of one engine. ``endpoint`` / ``replay_endpoint`` may end in
    ``:0`` (or be omitted) to bind a free loopback port; the bound addresses are attributes."""

    def __init__(
        self,
        topic: str,
        endpoint: str = "tcp://127.0.0.1:0",
        replay_endpoint: str = "tcp://127.0.0.1:0",
        buffer_size: int = 10_000,
        ctx: zmq.Context | None = None,
        buffer_bytes: int = REPLAY_BUFFER_BYTES,
    ):
        self.topic = topic.encode()
        self.ctx = ctx or zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.endpoint = _bind(self.pub, endpoint)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = _bind(self.router, replay_endpoint)
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque()
        self.buffer_size, self.buffer_bytes = buffer_size, buffer_bytes
        self.buffered_bytes = 0
        self.replay_requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, name="kv-replay", daemon=True)
        self._thread.start()

    def publish(self, events: list[dict[str, Any]], ts: float | None = None) -> int:
        """Send one EventBatch; returns its sequence number."""
        payload = encode_batch(events, ts)
        with self._lock:
            seq = self.seq
            self.seq += 1
            buf = self.buffer
            buf.append((seq, payload))
            self.buffered_bytes += len(payload)
            # The newest message is always kept, however large.
            while len(buf) > 1 and (
                len(buf) > self.buffer_size or self.buffered_bytes > self.buffer_bytes
            ):
                self.buffered_bytes -= len(buf.popleft()[1])
        self.pub.send_multipart([self.topic, seq_frame(seq), payload])
        return seq

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.router.poll(100):
                    continue
                frames = self.router.recv_multipart()
            except zmq.ZMQError:
                return  # closed
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # not a replay request: ignore, as a ROUTER must
            ident, start = frames[0], int.from_bytes(frames[2], "big", signed=True)
            self.replay_requests += 1
            with self._lock:
                items = [m for m in self.buffer if m[0] >= start]
            try:
                for seq, payload in items:
                    self.router.send_multipart([ident, b"", self.topic, seq_frame(seq), payload])
                self.router.send_multipart([ident, b"", b"", END_SEQ, b""])
            except zmq.ZMQError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.pub.close()
        self.router.close()


def _bind(sock: zmq.Socket, endpoint: str) -> str:
    if endpoint.endswith(":0"):
        port = sock.bind_to_random_port(endpoint[: endpoint.rindex(":")])
        return f"{endpoint[: endpoint.rindex(':')]}:{port}"
    sock.bind(endpoint)
    return endpoint
