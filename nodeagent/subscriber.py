"""ZMQ subscriber for one vLLM engine's KV events, with gap replay and resync.

vLLM publishes ``[topic, seq (8-byte big-endian), payload]`` on a PUB socket and keeps recent
messages for a ROUTER replay socket: a DEALER sends ``[b"", start_seq]`` and receives
``[b"", topic, seq, payload]`` for every buffered message with ``seq >= start_seq``, then
``[b"", b"", seq=-1, b""]``. On a gap the subscriber asks for the missing range; if the replay
socket is absent, silent or no longer holds the range, it resynchronises the engine (residency
cleared, snapshot reported) so the agent never claims blocks it may have missed. A sequence
number that goes backwards means the engine restarted: its residency and hash map are dropped.

An agent that starts beside a running engine first asks the replay socket for everything from
seq 0 (vLLM numbers each process's batches from 0 and keeps the last ``buffer_steps``, 10,000 by
default), so a restarted agent reports what the engine holds, not only what it stores next.

Socket direction follows vLLM's publisher: it binds for ``tcp://*:P`` (and ``::``, ``ipc://``,
``inproc://``) and *connects* to any other address. ``socket_mode="connect"`` (vLLM binds)
reaches a wildcard host on loopback, so vLLM's endpoint string can be given verbatim;
``socket_mode="bind"`` (vLLM connects) binds the SUB socket at that address.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from nodeagent.engine_residency import EngineResidency
from nodeagent.kvevents import EventDecodeError, decode_payload, decode_seq, encode_seq

log = logging.getLogger(__name__)


@dataclass
class SubscriberStats:
    messages: int = 0
    gaps: int = 0
    replayed: int = 0
    caught_up: int = 0  # batches applied from the replay socket at start
    duplicates: int = 0  # live batches already applied by that catch-up
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
        # Batches the catch-up applied, until live messages pass them: the same seq and payload
        # arriving live is a duplicate, a different payload under an old seq an engine restart.
        self._caught: dict[int, bytes] = {}

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

    def catch_up(self, before: int | None = None) -> int:
        """Apply the engine's history from the replay socket (seq 0 up, only seqs below
        ``before`` if given); returns the batches applied. Only before the first message.

        A history that does not start at 0 (the buffer wrapped) is applied too: its blocks are
        resident unless a later batch removed them, so nothing stale is claimed."""
        if self.last_seq is not None or self.replay is None:
            return 0
        got = self.replay(0)
        if not got:
            return 0
        batches = dict(sorted(got))
        if before is not None:
            batches = {s: p for s, p in batches.items() if s < before}
            # Only a run that ends right before the live message joins it without a gap.
            if not batches or max(batches) != before - 1:
                return 0
        run: list[int] = []
        for s in sorted(batches, reverse=True):  # the contiguous run ending at the newest
            if run and s != run[-1] - 1:
                break
            run.append(s)
        run.reverse()
        for s in run:
            self._apply(s, batches[s])
        self.stats.caught_up += len(run)
        if before is None:
            self._caught = {s: batches[s] for s in run}
        log.info(
            "engine %s: caught up on %d batch(es) %d..%d from the replay socket",
            self.residency.engine_id,
            len(run),
            run[0],
            run[-1],
        )
        return len(run)

    def on_message(self, seq: int, payload: bytes) -> None:
        self.stats.messages += 1
        last = self.last_seq
        if self._caught:
            if self._caught.get(seq) == payload:
                self.stats.duplicates += 1
                return
            if seq > max(self._caught):
                self._caught = {}
        if last is None and seq > 0 and self.catch_up(before=seq):
            last = self.last_seq
        if last is None or seq == last + 1:
            self._caught = {}
            self._apply(seq, payload)
            return
        self._caught = {}
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
            # The new process numbers from 0: fetch what it published before this one.
            self.last_seq = None
            if seq > 0:
                self.catch_up(before=seq)
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


def connect_address(endpoint: str) -> str:
    """Where to connect for a publisher bound at ``endpoint``: a wildcard host on loopback."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep:  # not-vocabulary: the ZMQ URL scheme
        return endpoint
    host, _, port = rest.rpartition(":")
    if host in ("*", "0.0.0.0"):
        return f"tcp://127.0.0.1:{port}"
    if host in ("[::]", "::"):
        return f"tcp://[::1]:{port}"
    return endpoint


class ReplayClient:
    """DEALER client of vLLM's ROUTER replay socket."""

    def __init__(self, ctx: zmq.Context, endpoint: str, timeout_s: float = 2.0):
        self.ctx = ctx
        self.endpoint = endpoint
        self.timeout_ms = int(timeout_s * 1000)
        self.answered: bool | None = None  # the last request's outcome (None: never asked)

    def __call__(self, start_seq: int) -> list[tuple[int, bytes]] | None:
        got = self._ask(start_seq)
        self.answered = got is not None
        return got

    def _ask(self, start_seq: int) -> list[tuple[int, bytes]] | None:
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
        socket_mode: str = "connect",
    ):
        super().__init__(name=f"kv-events-{residency.engine_id}", daemon=True)
        if socket_mode not in ("connect", "bind"):
            raise ValueError(f"socket_mode must be connect or bind, not {socket_mode!r}")
        self.ctx = ctx or zmq.Context.instance()
        self.endpoint = endpoint
        self.socket_mode = socket_mode
        self.topic = topic
        replay = ReplayClient(self.ctx, replay_endpoint) if replay_endpoint else None
        self.replay = replay
        self.topic_seen: str | None = None  # the topic the engine publishes under, once seen
        self.tracker = SequenceTracker(residency, replay)
        self.on_batch = on_batch
        self._stop_event = threading.Event()
        self.connected = threading.Event()
        self.caught_up = threading.Event()  # the start-up catch-up is done (or was not possible)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        if "[" in self.endpoint or "::" in self.endpoint:
            sock.setsockopt(zmq.IPV6, 1)
        try:
            if self.socket_mode == "bind":
                sock.bind(self.endpoint)
            else:
                sock.connect(connect_address(self.endpoint))
        except zmq.ZMQError as exc:
            log.error(
                "KV events of %s: cannot %s %s: %s",
                self.tracker.residency.engine_id,
                self.socket_mode,
                self.endpoint,
                exc,
            )
            sock.close()
            return
        self.connected.set()
        try:
            before = self.tracker.residency.stats.block_events
            if self.tracker.catch_up() and self.on_batch:
                self.on_batch(self.tracker.residency.stats.block_events - before)
            self.caught_up.set()
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
                self.topic_seen = frames[0].decode(errors="replace")
                before = self.tracker.residency.stats.block_events
                self.tracker.on_message(seq, frames[2])
                if self.on_batch:
                    self.on_batch(self.tracker.residency.stats.block_events - before)
        except Exception:  # never let one engine's stream take the agent down
            log.exception("KV-event subscriber for %s stopped", self.endpoint)
        finally:
            sock.close()
