"""A KV-event publisher speaking vLLM's wire protocol (PUB + ROUTER replay), for tests.

Stands in for the external engine: frames ``[topic, seq, payload]`` on PUB; a ROUTER socket
answers ``[b"", start_seq]`` with ``[b"", topic, seq, payload]`` for each buffered message with
``seq >= start_seq`` and the end marker ``[b"", b"", -1, b""]`` (data README's protocol).
"""

from __future__ import annotations

import threading
import time

import zmq


class TestPublisher:
    __test__ = False

    def __init__(self, buffer_size: int = 1000):
        self.ctx = zmq.Context()
        # XPUB: a PUB that also hears subscriptions, so a test can wait for its subscriber (ZMQ's
        # slow joiner: what is sent before the subscription arrives is dropped) instead of sleeping.
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, not just the first per topic
        self.subscriptions = 0
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        rport = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        self.buffer: list[tuple[int, bytes, bytes]] = []
        self.buffer_size = buffer_size
        self.replay_requests: list[int] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def publish(self, topic: bytes, seq: int, payload: bytes, deliver: bool = True) -> None:
        """Buffer the message for replay; ``deliver=False`` loses it on the PUB side."""
        with self.lock:
            self.buffer.append((seq, topic, payload))
            del self.buffer[: -self.buffer_size]
        if deliver:
            self.pub.send_multipart([topic, seq.to_bytes(8, "big", signed=True), payload])

    def wait_subscribed(self, more_than: int = 0, timeout: float = 15.0) -> int:
        """Return (the count) once more than ``more_than`` subscriptions have reached this publisher."""
        deadline = time.monotonic() + timeout
        while self.subscriptions <= more_than:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no new subscriber on {self.endpoint} after {timeout}s")
            if self.pub.poll(int(left * 1000)) and self.pub.recv()[:1] == b"\x01":
                self.subscriptions += 1
        return self.subscriptions

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(100):
                continue
            ident, _, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big", signed=True)
            self.replay_requests.append(start_seq)
            with self.lock:
                items = [m for m in self.buffer if m[0] >= start_seq]
            for seq, topic, payload in items:
                self.router.send_multipart(
                    [ident, b"", topic, seq.to_bytes(8, "big", signed=True), payload]
                )
            self.router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self._stop.set()
        self.thread.join()
        self.pub.close()
        self.router.close()
        self.ctx.term()
