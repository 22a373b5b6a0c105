"""ZMQ subscriber for one vLLM engine's KV events, with gap replay and resync.

vLLM publishes ``[topic, seq (8-byte big-endian), payload]`` on a PUB socket and keeps recent
messages for a ROUTER replay socket: a DEALER sends ``[b"", start_seq]`` and receives
``[b"", topic, seq, payload]`` for every buffered message with ``seq >= start_seq``, then
``[b"", b"", seq=-1, b""]``. On a gap the subscriber asks for the missing range; if the replay
socket is absent, silent or no longer holds the range, it resynchronises the engine (residency
cleared, snapshot reported) so the agent never claims blocks it may have missed. A sequence
number that goes backwards means the engine restarted: its residency and hash map are dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from nodeagent.kvevents import EventDecodeError, decode_payload, decode_seq, encode_seq
from nodeagent.residency import EngineResidency

log = logging.getLogger(__name__)


@dataclass
class SubscriberStats:
    messages: int = 0
    gaps: int = 0
    replayed: int = 0
    resyncs: int = 0
    restarts: int = 0
    decode_errors: int = 0


class SequenceTracker:
    """Applies messages in sequence order to a residency; decides replay / resync / restart.

    Transport-free so that the ordering rules are testable without sockets; ``replay`` is a
    callable ``(start_seq) -> list[(seq, payload)] | None`` (None: replay unavailable).
    """

    def __init__(
        self,
        residency: EngineResidency,
        replay: Callable[[int], list[tuple[int, bytes]] | None] | None = None,
    ):
        self.residency = residency
        self.replay = replay
        self.last_seq: int | None = None
        self.stats = SubscriberStats()

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            _, events, _ = decode_payload(payload)
            self.residency.apply_events(events)
        except (EventDecodeError, ValueError, TypeError) as exc:
            # A message we cannot read is a lost message: residency may now be wrong.
            self.stats.decode_errors += 1
            log.warning(
                "engine %s: undecodable message %d (%s): resync", self.residency.engine_id, seq, exc
            )
            self._resync()
        self.last_seq = seq

    def _resync(self) -> None:
        self.stats.resyncs += 1
        self.residency.reset(engine_restarted=False)

    def on_message(self, seq: int, payload: bytes) -> None:
        self.stats.messages += 1
        last = self.last_seq
        if last is None or seq == last + 1:
            self._apply(seq, payload)
            return
        if seq <= last:
            # Sequence went backwards: the engine (and its publisher) restarted.
            self.stats.restarts += 1
            log.info(
                "engine %s: sequence reset %d -> %d: clearing residency",
                self.residency.engine_id,
                last,
                seq,
            )
            self.residency.reset(engine_restarted=True)
            self._apply(seq, payload)
            return
        self.stats.gaps += 1
        missing = list(range(last + 1, seq))
        got = self.replay(last + 1) if self.replay else None
        replayed = {s: p for s, p in (got or []) if last < s < seq}
        if got is not None and all(s in replayed for s in missing):
            log.info(
                "engine %s: gap %d..%d recovered by replay",
                self.residency.engine_id,
                missing[0],
                missing[-1],
            )
            for s in missing:
                self.stats.replayed += 1
                self._apply(s, replayed[s])
        else:
            log.warning(
                "engine %s: gap %d..%d not replayable: resync",
                self.residency.engine_id,
                missing[0],
                missing[-1],
            )
            self._resync()
        self._apply(seq, payload)


class ReplayClient:
    """DEALER client of vLLM's ROUTER replay socket."""

    def __init__(self, ctx: zmq.Context, endpoint: str, timeout_s: float = 2.0):
        self.ctx = ctx
        self.endpoint = endpoint
        self.timeout_ms = int(timeout_s * 1000)

    def __call__(self, start_seq: int) -> list[tuple[int, bytes]] | None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.endpoint)
            sock.send_multipart([b"", encode_seq(start_seq)])
            out: list[tuple[int, bytes]] = []
            while True:
                if not sock.poll(self.timeout_ms):
                    return None  # replay socket silent: treat as unavailable
                frames = sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) < 3:
                    return None
                seq = decode_seq(frames[1])
                if seq == -1:
                    return out
                out.append((seq, frames[2]))
        except (zmq.ZMQError, EventDecodeError) as exc:
            log.warning("replay from %s failed: %s", self.endpoint, exc)
            return None
        finally:
            sock.close()


class EngineSubscriber(threading.Thread):
    """Background thread: SUB socket -> SequenceTracker -> EngineResidency."""

    def __init__(
        self,
        residency: EngineResidency,
        endpoint: str,
        replay_endpoint: str = "",
        topic: str = "",
        ctx: zmq.Context | None = None,
        on_batch: Callable[[int], None] | None = None,
    ):
        super().__init__(name=f"kv-events-{residency.engine_id}", daemon=True)
        self.ctx = ctx or zmq.Context.instance()
        self.endpoint = endpoint
        self.topic = topic
        replay = ReplayClient(self.ctx, replay_endpoint) if replay_endpoint else None
        self.tracker = SequenceTracker(residency, replay)
        self.on_batch = on_batch
        self._stop_event = threading.Event()
        self.connected = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sock.connect(self.endpoint)
        self.connected.set()
        try:
            while not self._stop_event.is_set():
                if not sock.poll(200):
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 3:
                    self.tracker.stats.decode_errors += 1
                    continue
                try:
                    seq = decode_seq(frames[1])
                except EventDecodeError:
                    self.tracker.stats.decode_errors += 1
                    continue
                before = self.tracker.residency.stats.block_events
                self.tracker.on_message(seq, frames[2])
                if self.on_batch:
                    self.on_batch(self.tracker.residency.stats.block_events - before)
        except Exception:  # never let one engine's stream take the agent down
            log.exception("KV-event subscriber for %s stopped", self.endpoint)
        finally:
            sock.close()
