"""``tcp`` transport: agent to agent, chunked, checksummed, rate-limited.

Wire protocol (one connection per attempt, source -> target)::

    source: b"PWX1" + u32 length + JSON header
            {"job_id", "attempt", "keys": [hex], "sizes": [bytes per block], "checksum": hex,
             "mac": hex}
    target: u32 length + JSON {"ok": true, "mac": hex} | {"ok": false, "error": "..."}
            (accept, proving the secret back: ``auth.answer``; or refuse)
    source: the blocks' bytes, concatenated in header order
    target: u32 length + JSON {"ok": true, "checksum": hex} | {"ok": false, "error": "..."}

``mac`` is the HMAC of the rest of the header under the job's secret (``transfers/auth.py``): the
target refuses a header without a valid one, or naming other keys than its job's, before it reads
any block, and notes the refusal; if the genuine source never delivers, the target's job result
says whom it refused and why. A refusal does not fail the target's job, so a stranger who learns
a job id cannot cancel the copy either. The target hashes each block as it lands (a thread pool:
hashlib releases the GIL), compares the transfer checksum with the header's and only then writes
the blocks into its store. It accepts only job ids it has been assigned
(``TcpTransferServer.expect``); a source that connects before the target has its assignment is
told ``unknown job`` and tries again until the deadline.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from nodeagent.blockstore import BlockStore, BlockStoreFull, block_digest, transfer_checksum
from nodeagent.transfers.auth import MAC_FIELD, AuthError, answer, sign, verify, verify_answer
from nodeagent.transfers.base import Job, Progress, TransferResult
from wire import protocol
from wire.blockhash import from_hex, to_hex

log = logging.getLogger(__name__)
MAGIC = b"PWX1"
MAX_HEADER = 16 << 20
UNKNOWN_JOB = "unknown job"
SOCK_BUF = 4 << 20
ABORTED = "aborted: the job was cancelled, its deadline passed or the agent is stopping"
ABORT_POLL_S = 0.2  # how soon a waiting target notices an abort


def _send_msg(sock: socket.socket, obj: dict[str, Any]) -> None:
    body = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(body)) + body)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    n = view.nbytes
    while got < n:
        r = sock.recv_into(view[got:], n - got)
        if r == 0:
            raise ConnectionError("peer closed the connection mid-transfer")
        got += r


def _recv_msg(sock: socket.socket) -> dict[str, Any]:
    head = bytearray(4)
    _recv_exact(sock, memoryview(head))
    (n,) = struct.unpack("!I", head)
    if n > MAX_HEADER:
        raise ConnectionError(f"message of {n} bytes is too large")
    body = bytearray(n)
    _recv_exact(sock, memoryview(body))
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise ConnectionError("message is not a JSON object")
    return obj


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
        except OSError:
            pass  # the kernel caps it; the default still works


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class Expected:
    """A transfer the target has been assigned and waits for."""

    job_id: str
    progress: Progress | None = None
    secret: str = field(default="", repr=False)
    keys: list[int] | None = None  # the job's keys; a header naming others is refused
    done: threading.Event = field(default_factory=threading.Event)
    result: TransferResult | None = None
    refused: list[str] = field(default_factory=list)  # "peer: why", for the job's result

    def refuse(self, peer: str, why: str) -> None:
        if len(self.refused) < 20:  # bounded: a flood of strangers must not grow it forever
            self.refused.append(f"{peer}: {why}")


class TcpTransferServer:
    """The target side: accepts transfers for expected jobs and verifies them."""

    def __init__(self, listen: str, store: BlockStore, hash_threads: int = 2):
        host, port = split_addr(listen)
        self.store = store
        self.sock = socket.create_server((host, port), reuse_port=False)
        host_, port_ = self.sock.getsockname()[:2]
        self.address = f"{host_}:{port_}"
        self.pool = ThreadPoolExecutor(hash_threads, thread_name_prefix="xfer-hash")
        self._expected: dict[str, Expected] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.thread = threading.Thread(target=self._serve, name="tcp-transfer", daemon=True)

    def start(self) -> TcpTransferServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.close()
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def expect(
        self,
        job_id: str,
        progress: Progress | None = None,
        secret: str = "",
        keys: list[int] | None = None,
    ) -> Expected:
        with self._lock:
            exp = self._expected.get(job_id)
            if exp is None or exp.done.is_set():
                exp = self._expected[job_id] = Expected(job_id, progress, secret, keys)
            return exp

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._expected.pop(job_id, None)

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._handle, args=(conn, peer), daemon=True).start()

    def _handle(self, conn: socket.socket, peer: Any = None) -> None:
        exp: Expected | None = None
        who = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "peer"
        try:
            _tune(conn)
            conn.settimeout(60)
            magic = bytearray(4)
            _recv_exact(conn, memoryview(magic))
            if bytes(magic) != MAGIC:
                return
            header = _recv_msg(conn)
            with self._lock:
                exp = self._expected.get(str(header.get("job_id")))
            if exp is None or exp.done.is_set():
                _send_msg(conn, {"ok": False, "error": UNKNOWN_JOB})
                return
            try:
                verify(exp.secret, header)
            except AuthError as exc:
                exp.refuse(who, str(exc))
                log.warning("job %s: refused a transfer from %s: %s", exp.job_id, who, exc)
                _send_msg(conn, {"ok": False, "error": f"not authenticated: {exc}"})
                return
            keys = [from_hex(k) for k in header["keys"]]
            sizes = [int(s) for s in header["sizes"]]
            if len(keys) != len(sizes) or any(s < 0 for s in sizes):
                _send_msg(conn, {"ok": False, "error": "keys and sizes disagree"})
                return
            if exp.keys is not None and keys != exp.keys:
                exp.refuse(who, "header names other blocks than the job's")
                _send_msg(conn, {"ok": False, "error": "keys differ from the job's"})
                return
            _send_msg(conn, {"ok": True, MAC_FIELD: answer(exp.secret, header)})
            result = self._receive_blocks(conn, exp, keys, sizes, str(header["checksum"]))
            _send_msg(conn, {"ok": result.ok, "checksum": result.checksum, "error": result.error})
            exp.result = result
            exp.done.set()
        except (OSError, ConnectionError, ValueError, KeyError) as exc:
            # The source will see the broken connection and retry or fail its job.
            log.info("incoming transfer broke off: %s", exc)
        finally:
            conn.close()

    def _receive_blocks(
        self, conn: socket.socket, exp: Expected, keys: list[int], sizes: list[int], expected: str
    ) -> TransferResult:
        buffers: list[bytearray] = []
        futures = []
        done = 0
        for size in sizes:
            buf = bytearray(size)
            _recv_exact(conn, memoryview(buf))
            buffers.append(buf)
            futures.append(self.pool.submit(block_digest, buf))
            done += size
            if exp.progress:
                exp.progress(done)
        digests = [f.result() for f in futures]
        checksum = transfer_checksum(digests)
        if checksum != expected:
            return TransferResult(False, done, checksum, "checksum mismatch: blocks not stored")
        try:
            for key, buf, dig in zip(keys, buffers, digests, strict=True):
                self.store.write(key, buf, digest=dig)  # type: ignore[call-arg]
        except BlockStoreFull as exc:
            return TransferResult(False, done, checksum, str(exc))
        return TransferResult(True, done, checksum)


class TcpTransport:
    name = protocol.TRANSPORT_TCP

    def __init__(
        self,
        server: TcpTransferServer | None,
        rate_limit_bytes_per_s: int = 0,
        chunk_bytes: int = 4 << 20,
        connect_timeout_s: float = 10.0,
        retries: int = 2,
    ):
        self.server = server
        self.rate = rate_limit_bytes_per_s
        self.chunk = chunk_bytes
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries

    # -- target ------------------------------------------------------------------------------
    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        if self.server is None:
            return TransferResult(False, error="this agent runs no transfer server")
        exp = self.server.expect(job.id, progress, job.secret, job.keys)
        woken = threading.Event()
        undo = job.on_abort(woken.set)
        try:
            end = time.monotonic() + max(job.seconds_left(), 0)
            while not exp.done.is_set() and not woken.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    break
                # exp.done and the abort are two events: wake on either within a beat.
                exp.done.wait(timeout=min(left, ABORT_POLL_S))
            if job.aborted.is_set() and not exp.done.is_set():
                return TransferResult(False, error=ABORTED)
            if not exp.done.is_set():
                why = "deadline passed before the source delivered"
                if exp.refused:
                    why += f"; refused {len(exp.refused)} unauthenticated sender(s): " + "; ".join(
                        exp.refused[:3]
                    )
                return TransferResult(False, error=why)
            assert exp.result is not None
            return exp.result
        finally:
            undo()
            self.server.forget(job.id)

    # -- source ------------------------------------------------------------------------------
    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        addr = job.target.get("transfer")
        if not addr:
            return TransferResult(False, error="job has no target transfer address")
        if not job.secret:
            return TransferResult(False, error="job carries no transfer secret: refusing to send")
        missing = [to_hex(k) for k in job.keys if not store.contains(k)]
        if missing:
            return TransferResult(
                False, error=f"{len(missing)} block(s) not in the block store, first {missing[0]}"
            )
        failures = 0
        while True:
            if job.aborted.is_set():
                return TransferResult(False, error=ABORTED)
            try:
                return self._send_once(job, store, progress, addr)
            except _NotYetExpected:
                if job.seconds_left() <= 0:
                    return TransferResult(False, error="target never accepted the job")
                job.aborted.wait(min(0.2, max(job.seconds_left(), 0)))
            except (OSError, ConnectionError, ValueError) as exc:
                if job.aborted.is_set():
                    return TransferResult(False, error=ABORTED)
                failures += 1
                if failures > self.retries or job.seconds_left() <= 0:
                    return TransferResult(False, error=f"transfer to {addr} failed: {exc}")
                log.info(
                    "job %s: attempt %d to %s failed (%s); retrying", job.id, failures, addr, exc
                )
                job.aborted.wait(min(0.5 * failures, max(job.seconds_left(), 0)))

    def _send_once(
        self, job: Job, store: BlockStore, progress: Progress, addr: str
    ) -> TransferResult:
        views = [store.read(k) for k in job.keys]
        sizes = [v.nbytes for v in views]
        checksum = transfer_checksum(store.digest(k) for k in job.keys)
        header = {
            "job_id": job.id,
            "attempt": job.attempt,
            "keys": [to_hex(k) for k in job.keys],
            "sizes": sizes,
            "checksum": checksum,
        }
        header[MAC_FIELD] = sign(job.secret, header)
        connect_s = min(self.connect_timeout_s, _left(job))
        with socket.create_connection(split_addr(addr), timeout=connect_s) as sock:
            # The job's abort (deadline, cancel, agent stopping) wakes a blocked send or receive.
            undo = job.on_abort(lambda: sock.shutdown(socket.SHUT_RDWR))
            try:
                return self._exchange(job, sock, views, header, progress, addr)
            finally:
                undo()

    def _exchange(
        self,
        job: Job,
        sock: socket.socket,
        views: list[memoryview],
        header: dict[str, Any],
        progress: Progress,
        addr: str,
    ) -> TransferResult:
        checksum = header["checksum"]
        _tune(sock)
        # Every call on the socket is bounded by what is left of the job's deadline, so a
        # peer that stops reading (or answering) cannot keep the job past it.
        sock.settimeout(_left(job))
        sock.sendall(MAGIC)
        _send_msg(sock, header)
        sock.settimeout(_left(job))
        reply = _recv_msg(sock)
        if not reply.get("ok"):
            if reply.get("error") == UNKNOWN_JOB:
                raise _NotYetExpected()
            return TransferResult(False, error=f"target refused: {reply.get('error')}")
        try:
            verify_answer(job.secret, header, reply.get(MAC_FIELD))
        except AuthError as exc:
            return TransferResult(False, error=f"target at {addr}: {exc}")
        sent = 0
        start = time.monotonic()
        for view in views:
            for off in range(0, view.nbytes, self.chunk):
                piece = view[off : off + self.chunk]
                sock.settimeout(_left(job))
                sock.sendall(piece)
                sent += piece.nbytes
                if self.rate:
                    ahead = start + sent / self.rate - time.monotonic()
                    if ahead > 0:
                        job.aborted.wait(ahead)
            progress(sent)
        sock.settimeout(_left(job))
        final = _recv_msg(sock)
        if not final.get("ok"):
            return TransferResult(
                False, sent, final.get("checksum"), f"target: {final.get('error')}"
            )
        if final.get("checksum") != checksum:
            return TransferResult(False, sent, final.get("checksum"), "target checksum differs")
        return TransferResult(True, sent, checksum)


def _left(job: Job) -> float:
    """Seconds left to the job's deadline for the next socket call; TimeoutError when none."""
    if job.aborted.is_set():
        raise TimeoutError(ABORTED)
    left = job.seconds_left()
    if left <= 0:
        raise TimeoutError("the job's deadline passed")
    return left


class _NotYetExpected(Exception):
    """The target has not been assigned this job yet."""
