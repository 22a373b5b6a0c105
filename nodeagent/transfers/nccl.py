"""``nccl`` transport: ``torch.distributed`` send/recv in a two-rank group per job.

The source is rank 0 and the target rank 1, meeting at the job's ``rendezvous``
(``master_addr``, ``master_port``). Backend ``nccl`` when CUDA is available, else ``gloo`` (how
the tests run it on CPU). The source sends the sizes and the expected checksum digest first,
then each block; the target hashes what arrived, compares and answers one flag, and writes the
blocks only if they match. torch is the optional ``nccl`` extra: without it the transport
reports itself unavailable. One group per process at a time, so jobs on this transport run
one after another.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from nodeagent.blockstore import BlockStore, block_digest, transfer_checksum
from nodeagent.transfers.base import Job, Progress, TransferResult

_GROUP_LOCK = threading.Lock()


def torch_available() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available()
    except ImportError:
        return False


class NcclTransport:
    name = "nccl"

    def __init__(self, device: str | None = None):
        self.device = device

    def _setup(self, job: Job, rank: int) -> tuple[Any, Any, str]:
        import torch
        import torch.distributed as dist

        rv = job.rendezvous
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        device = self.device or ("cuda" if backend == "nccl" else "cpu")
        dist.init_process_group(
            backend,
            init_method=f"tcp://{rv['master_addr']}:{int(rv['master_port'])}",
            rank=rank,
            world_size=int(rv.get("world_size", 2)),
            timeout=timedelta(seconds=max(job.seconds_left(), 5)),
        )
        return torch, dist, device

    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        if not torch_available():
            return TransferResult(False, error="nccl transport needs torch (the nccl extra)")
        with _GROUP_LOCK:
            torch, dist, device = self._setup(job, 0)
            try:
                views = [store.read(k) for k in job.keys]
                checksum = transfer_checksum(store.digest(k) for k in job.keys)
                sizes = torch.tensor([v.nbytes for v in views], dtype=torch.int64, device=device)
                dist.send(torch.tensor([len(views)], dtype=torch.int64, device=device), dst=1)
                dist.send(sizes, dst=1)
                dist.send(
                    torch.frombuffer(bytearray(bytes.fromhex(checksum)), dtype=torch.uint8).to(
                        device
                    ),
                    dst=1,
                )
                sent = 0
                for v in views:
                    dist.send(torch.frombuffer(v, dtype=torch.uint8).to(device), dst=1)
                    sent += v.nbytes
                    progress(sent)
                ok = torch.zeros(1, dtype=torch.int64, device=device)
                dist.recv(ok, src=1)
                if int(ok.item()) != 1:
                    return TransferResult(False, sent, None, "target reported checksum mismatch")
                return TransferResult(True, sent, checksum)
            except (RuntimeError, KeyError, ValueError) as exc:
                return TransferResult(False, error=f"nccl send failed: {exc}")
            finally:
                dist.destroy_process_group()

    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        if not torch_available():
            return TransferResult(False, error="nccl transport needs torch (the nccl extra)")
        with _GROUP_LOCK:
            torch, dist, device = self._setup(job, 1)
            try:
                count = torch.zeros(1, dtype=torch.int64, device=device)
                dist.recv(count, src=0)
                sizes = torch.zeros(int(count.item()), dtype=torch.int64, device=device)
                dist.recv(sizes, src=0)
                expected = torch.zeros(32, dtype=torch.uint8, device=device)
                dist.recv(expected, src=0)
                blocks, digests, done = [], [], 0
                for n in sizes.tolist():
                    buf = torch.empty(int(n), dtype=torch.uint8, device=device)
                    dist.recv(buf, src=0)
                    data = buf.cpu().numpy().tobytes()
                    blocks.append(data)
                    digests.append(block_digest(data))
                    done += int(n)
                    progress(done)
                checksum = transfer_checksum(digests)
                ok = checksum == bytes(expected.cpu().tolist()).hex()
                dist.send(torch.tensor([1 if ok else 0], dtype=torch.int64, device=device), dst=0)
                if not ok:
                    return TransferResult(False, done, checksum, "checksum mismatch: not stored")
                for key, data, dig in zip(job.keys, blocks, digests, strict=True):
                    store.write(key, data, digest=dig)  # type: ignore[call-arg]
                return TransferResult(True, done, checksum)
            except (RuntimeError, ValueError) as exc:
                return TransferResult(False, error=f"nccl receive failed: {exc}")
            finally:
                dist.destroy_process_group()
