"""``nccl`` transport: ``torch.distributed`` send/recv in a two-rank group per job.

The source is rank 0 and the target rank 1, meeting at the job's ``rendezvous``
(``master_addr``, ``master_port``; rank 0 hosts the store there). Backend ``nccl`` when CUDA is
available, else ``gloo`` (how the tests run it on CPU). Wire order, all from rank 0 unless said:

1. header length (int64), then the header: JSON ``{"job", "attempt", "keys", "sizes",
   "checksum", "mac"}`` bytes, ``mac`` the HMAC of the rest under the job's secret
   (``transfers/auth.py``); the target refuses a header without a valid mac, naming another job
   or other keys by leaving the group (before any block), which breaks the source's next send;
   otherwise, from rank 1, its proof (``auth.answer``, 64 hex bytes), which rank 0 checks before
   it sends a block (torch's rendezvous store listens on every interface: a stranger could join);
2. each block (uint8);
3. from rank 1, one int64 flag: 1 stored, 0 checksum mismatch, 2 could not store.

The target hashes what arrived, compares with the header's checksum and writes the blocks only
if they match; any failure after that removes what it wrote, so a failed receive leaves nothing
stored. The group's timeout is the time left to the job's deadline: a peer that never joins or
stops answering fails the job then. torch is the optional ``nccl`` extra: without it the
transport reports itself unavailable. torch keeps one default group per process, so jobs on
this transport run one after another.
"""

from __future__ import annotations

import json
import threading
import warnings
from datetime import timedelta
from typing import Any

from nodeagent.blockstore import BlockStore, BlockStoreFull, block_digest, transfer_checksum
from nodeagent.transfers.auth import MAC_FIELD, AuthError, answer, sign, verify, verify_answer
from nodeagent.transfers.base import Job, Progress, TransferResult
from wire import protocol
from wire.blockhash import to_hex

_GROUP_LOCK = threading.Lock()
STORED, MISMATCH, STORE_FAILED = 1, 0, 2
PROOF_BYTES = 64  # the target's answer, hex


def torch_available() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available()
    except ImportError:
        return False


class RendezvousError(RuntimeError):
    """The two-rank group could not be formed (bad rendezvous, peer absent, deadline)."""


class NcclTransport:
    name = protocol.TRANSPORT_NCCL

    def __init__(self, device: str | None = None):
        self.device = device

    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        return self._run(job, store, progress, rank=0)

    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        return self._run(job, store, progress, rank=1)

    def _run(self, job: Job, store: BlockStore, progress: Progress, rank: int) -> TransferResult:
        side = "send" if rank == 0 else "receive"
        if not torch_available():
            return TransferResult(False, error="nccl transport needs torch (the nccl extra)")
        if not job.secret:
            return TransferResult(False, error="job carries no transfer secret: refused")
        if rank == 0:
            missing = [k for k in job.keys if not store.contains(k)]
            if missing:
                n, first = len(missing), to_hex(missing[0])
                return TransferResult(False, error=f"{n} block(s) not in the block store: {first}")
        with _GROUP_LOCK:
            try:
                torch, dist, device = self._join(job, rank)
            except RendezvousError as exc:
                return TransferResult(False, error=f"nccl {side} failed: {exc}")
            try:
                io = _Wire(torch, dist, device)
                if rank == 0:
                    return _send_blocks(io, job, store, progress)
                return _receive_blocks(io, job, store, progress)
            except (RuntimeError, ValueError, KeyError) as exc:
                # A peer that died or timed out surfaces here as a RuntimeError from the backend.
                return TransferResult(False, error=f"nccl {side} failed: {_first_line(exc)}")
            finally:
                dist.destroy_process_group()

    def _join(self, job: Job, rank: int) -> tuple[Any, Any, str]:
        import torch
        import torch.distributed as dist

        rv = job.rendezvous
        try:
            addr, port = str(rv["master_addr"]), int(rv["master_port"])
            world = int(rv.get("world_size", 2))
        except (KeyError, TypeError, ValueError):
            raise RendezvousError(
                f"job rendezvous {rv!r} needs master_addr and master_port"
            ) from None
        if world != 2:
            raise RendezvousError(f"world_size must be 2 (one source, one target), not {world}")
        left = job.seconds_left()
        if left <= 0:
            raise RendezvousError("deadline passed before the group formed")
        backend = "nccl" if torch.cuda.is_available() else "gloo"  # not-vocabulary: torch's
        device = self.device or ("cuda" if backend == "nccl" else "cpu")  # not-vocabulary: torch's
        try:
            dist.init_process_group(
                backend,
                init_method=f"tcp://{addr}:{port}",
                rank=rank,
                world_size=2,
                timeout=timedelta(seconds=left),
            )
        except (RuntimeError, ValueError) as exc:  # DistStoreError / DistNetworkError included
            # init_process_group names the default group from a process-wide counter before the
            # rendezvous and does not undo that on failure; left as is, this agent's next group
            # would look for its peer under another store key and never meet it.
            if not dist.is_initialized():
                dist.distributed_c10d._world.group_count = 0
            raise RendezvousError(
                f"peer did not join {addr}:{port} within {left:.1f}s ({_first_line(exc)})"
            ) from None
        return torch, dist, device


class _Wire:
    """Tensor send/recv to the other rank of the two-rank group."""

    def __init__(self, torch: Any, dist: Any, device: str):
        self.torch, self.dist, self.device = torch, dist, device
        self.peer = 1 - dist.get_rank()

    def send_bytes(self, data: bytes | memoryview) -> None:
        with warnings.catch_warnings():
            # frombuffer warns on read-only buffers (file-store blocks); the tensor is only read.
            warnings.simplefilter("ignore", UserWarning)
            t = self.torch.frombuffer(data, dtype=self.torch.uint8)
        self.dist.send(t.to(self.device), dst=self.peer)

    def recv_bytes(self, n: int) -> bytearray:
        buf = self.torch.empty(n, dtype=self.torch.uint8, device=self.device)
        self.dist.recv(buf, src=self.peer)
        return bytearray(buf.cpu().numpy())

    def send_int(self, v: int) -> None:
        self.dist.send(
            self.torch.tensor([v], dtype=self.torch.int64, device=self.device), self.peer
        )

    def recv_int(self) -> int:
        t = self.torch.zeros(1, dtype=self.torch.int64, device=self.device)
        self.dist.recv(t, src=self.peer)
        return int(t.item())


def _send_blocks(io: _Wire, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
    views = [store.read(k) for k in job.keys]
    checksum = transfer_checksum(store.digest(k) for k in job.keys)
    fields: dict[str, Any] = {
        "job": job.id,
        "attempt": job.attempt,
        "keys": [to_hex(k) for k in job.keys],
        "sizes": [v.nbytes for v in views],
        "checksum": checksum,
    }
    fields[MAC_FIELD] = sign(job.secret, fields)
    header = json.dumps(fields).encode()
    io.send_int(len(header))
    io.send_bytes(header)
    try:
        verify_answer(
            job.secret, fields, bytes(io.recv_bytes(PROOF_BYTES)).decode("ascii", "replace")
        )
    except AuthError as exc:
        raise ValueError(str(exc)) from None
    sent = 0
    for v in views:
        if v.nbytes:
            io.send_bytes(v)
        sent += v.nbytes
        progress(sent)
    flag = io.recv_int()
    if flag == MISMATCH:
        return TransferResult(False, sent, None, "target reported checksum mismatch")
    if flag != STORED:
        return TransferResult(False, sent, None, "target could not store the blocks")
    return TransferResult(True, sent, checksum)


def _receive_blocks(io: _Wire, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
    header = json.loads(io.recv_bytes(io.recv_int()))
    if not isinstance(header, dict):
        raise ValueError("peer sent a malformed header")
    try:
        verify(job.secret, header)
    except AuthError as exc:
        raise ValueError(f"refused the peer: {exc}") from None
    if header.get("job") != job.id or header.get("keys") != [to_hex(k) for k in job.keys]:
        raise ValueError(f"peer sent job {header.get('job')!r} with other keys: refused")
    sizes = [int(n) for n in header["sizes"]]
    if len(sizes) != len(job.keys) or any(n < 0 for n in sizes):
        raise ValueError("peer sent a malformed header")
    io.send_bytes(answer(job.secret, header).encode("ascii"))
    blocks, digests, done = [], [], 0
    for n in sizes:
        data = io.recv_bytes(n) if n else bytearray()
        blocks.append(data)
        digests.append(block_digest(data))
        done += n
        progress(done)
    checksum = transfer_checksum(digests)
    if checksum != header["checksum"]:
        io.send_int(MISMATCH)
        return TransferResult(False, done, checksum, "checksum mismatch: blocks not stored")
    written: list[int] = []
    try:
        for key, data, dig in zip(job.keys, blocks, digests, strict=True):
            store.write(key, data, digest=dig)  # type: ignore[call-arg]
            written.append(key)
    except (BlockStoreFull, OSError) as exc:
        _remove(store, written)
        io.send_int(STORE_FAILED)
        return TransferResult(False, done, checksum, f"could not store the blocks: {exc}")
    try:
        io.send_int(STORED)
    except RuntimeError:
        _remove(store, written)  # the source will report failure: keep the two sides agreeing
        raise
    return TransferResult(True, done, checksum)


def _remove(store: BlockStore, keys: list[int]) -> None:
    for k in keys:
        store.delete(k)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
