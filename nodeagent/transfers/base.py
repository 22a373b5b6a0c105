"""The transfer interface, the job description it works from, and its result."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from nodeagent.blockstore import BlockStore
from wire import protocol
from wire.blockhash import from_hex

Progress = Callable[[int], None]  # bytes done so far


class JobError(ValueError):
    """A job message that cannot be executed as written."""


@dataclass
class Job:
    """One role's share of a replication job, as ``job.assign`` describes it."""

    id: str
    action: str
    role: str
    transport: str
    keys: list[int]
    bytes: int = 0
    bytes_per_block: int = 0
    source: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    rendezvous: dict[str, Any] = field(default_factory=dict)
    lmcache: dict[str, Any] = field(default_factory=dict)
    secret: str = field(
        default="", repr=False
    )  # per-job transfer secret from the control plane (transfers/auth.py)
    deadline: float = 0.0
    attempt: int = 1
    # The prefix's token ids (executors that address KV by tokens: warmup, lmcache, lmcache-mp).
    tokens: list[int] = field(default_factory=list)
    block_size: int = 0
    hold_until: float = (
        0.0  # the replica's TTL end (unix time): LMCache leases are renewed until then
    )
    # Set when the job must end now (its deadline passed, the control plane cancelled it, or the
    # agent is stopping): an executor blocked in a socket call registers ``on_abort`` to wake up.
    aborted: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _on_abort: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)
    _abort_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> Job:
        try:
            keys = [from_hex(k) for k in msg.get("keys") or []]
            job = cls(
                id=str(msg["id"]),
                action=msg.get("action", protocol.ACTION_REPLICATE),
                role=msg["role"],
                transport=msg.get("transport", protocol.TRANSPORT_TCP),
                keys=keys,
                bytes=int(msg.get("bytes") or 0),
                bytes_per_block=int(msg.get("bytes_per_block") or 0),
                source=msg.get(protocol.ROLE_SOURCE) or {},
                target=msg.get(protocol.ROLE_TARGET) or {},
                rendezvous=msg.get("rendezvous") or {},
                lmcache=msg.get(protocol.FIELD_LMCACHE) or {},
                secret=str(msg.get("secret") or ""),
                deadline=float(msg.get("deadline") or time.time() + 300),
                attempt=int(msg.get("attempt") or 1),
                tokens=_tokens(msg.get("tokens")),
                block_size=int(msg.get("block_size") or 0),
                hold_until=float(msg.get("hold_until") or 0.0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise JobError(f"malformed job: {exc}") from None
        if job.role not in protocol.ROLES:
            raise JobError(f"job {job.id}: role must be {' or '.join(protocol.ROLES)}")
        if job.action not in protocol.ACTIONS:
            raise JobError(f"job {job.id}: action must be {' or '.join(protocol.ACTIONS)}")
        return job

    def seconds_left(self) -> float:
        return self.deadline - time.time()

    def abort(self) -> None:
        """End the job now: set ``aborted`` and run every registered ``on_abort`` callback."""
        with self._abort_lock:
            self.aborted.set()
            callbacks, self._on_abort = self._on_abort, []
        for fn in callbacks:
            try:
                fn()
            except OSError:
                pass  # e.g. a socket already closed

    def on_abort(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` when the job is aborted (at once if it already is); returns the undo."""
        with self._abort_lock:
            if not self.aborted.is_set():
                self._on_abort.append(fn)

                def undo() -> None:
                    with self._abort_lock:
                        if fn in self._on_abort:
                            self._on_abort.remove(fn)

                return undo
        fn()
        return lambda: None


def _tokens(raw: Any) -> list[int]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(type(t) is int and 0 <= t < 2**32 for t in raw):
        raise ValueError("tokens must be a list of token ids (integers in [0, 2**32))")
    return raw


@dataclass
class TransferResult:
    ok: bool
    bytes: int = 0
    checksum: str | None = None
    error: str | None = None
    # Executor-specific fields of the job.result: executor, confirmation, cached_tokens, detail.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, executor: str, why: str) -> TransferResult:
        """An executor's refusal or failure, named for the job.result."""
        return cls(False, error=why, extra={"executor": executor})


@runtime_checkable
class Background(Protocol):
    """An executor with work of its own beside its jobs (the lmcache executor renews leases):
    the agent starts it, handing it the runner's ``notify`` for events not tied to a message,
    and stops it on the way out."""

    def start(self, notify: Callable[[dict[str, Any]], None]) -> None: ...

    def stop(self) -> None: ...


class Executor(Protocol):
    """A transport's executor (tcp, nccl, lmcache, ...). Moves the blocks of ``job.keys`` from the source agent's store to the target's.

    The source side calls ``send``; the target side ``receive``. Only a ``receive`` that
    verified the checksum may return ``ok=True``.
    """

    name: str

    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult: ...

    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult: ...
