"""Benchmark: ``tcp`` transfer between two agent processes on loopback, checksum-verified.

The receiver is a separate process running the agent's transfer server over a memory block
store; the sender is this process with the agent's ``TcpTransport``. Baseline: a raw socket copy
of the same bytes between two processes in the same run. Target: >= 1 GB/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodeagent.blockstore import MemoryBlockStore  # noqa: E402
from nodeagent.transfers.base import Job  # noqa: E402
from nodeagent.transfers.tcp import TcpTransferServer, TcpTransport  # noqa: E402
from wire import protocol  # noqa: E402

BLOCK = 4 << 20


def receiver(conn, job_ids):
    store = MemoryBlockStore(max_bytes=64 << 30)
    srv = TcpTransferServer("127.0.0.1:0", store, hash_threads=2).start()
    waits = [srv.expect(j, secret=f"secret-{j}") for j in job_ids]
    conn.send(srv.address)
    for w in waits:
        w.done.wait(600)
        conn.send((w.result.ok, w.result.checksum, w.result.error))
        for k in store.keys():
            store.delete(k)


def raw_receiver(conn, total):
    s = socket.create_server(("127.0.0.1", 0))
    conn.send(s.getsockname()[1])
    c, _ = s.accept()
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    got = 0
    while got < total:
        n = c.recv_into(view)
        if not n:
            break
        got += n
    c.sendall(b"k")


def run(n_blocks: int, repeats: int) -> dict:
    src = MemoryBlockStore(max_bytes=64 << 30)
    data = os.urandom(BLOCK)
    keys = list(range(1, n_blocks + 1))
    for k in keys:
        src.write(k, data)
    total = n_blocks * BLOCK
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    ids = [f"bench-{i}" for i in range(repeats)]
    p = ctx.Process(target=receiver, args=(b, ids), daemon=True)
    p.start()
    addr = a.recv()
    tr = TcpTransport(None)
    best_tcp = 0.0
    for jid in ids:
        job = Job(
            jid,
            protocol.ACTION_REPLICATE,
            protocol.ROLE_SOURCE,
            protocol.TRANSPORT_TCP,
            keys,
            target={"transfer": addr},
            secret=f"secret-{jid}",  # both sides hold the job's secret (transfers/auth.py)
            deadline=time.time() + 600,
        )
        t0 = time.perf_counter()
        res = tr.send(job, src, lambda n: None)
        dt = time.perf_counter() - t0
        ok, checksum, err = a.recv()
        assert res.ok and ok and checksum == res.checksum, (res, err)
        best_tcp = max(best_tcp, total / dt)
    p.join(10)
    best_raw = 0.0
    for _ in range(repeats):
        a, b = ctx.Pipe()
        p = ctx.Process(target=raw_receiver, args=(b, total), daemon=True)
        p.start()
        port = a.recv()
        with socket.create_connection(("127.0.0.1", port)) as s:
            t0 = time.perf_counter()
            view = memoryview(data)
            for _ in range(n_blocks):
                s.sendall(view)
            s.recv(1)
            best_raw = max(best_raw, total / (time.perf_counter() - t0))
        p.join(10)
    return {
        "bytes": total,
        "block_bytes": BLOCK,
        "tcp_bytes_per_s": round(best_tcp),
        "baseline_bytes_per_s": round(best_raw),
        "target_bytes_per_s": 1_000_000_000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    ap.add_argument("--json", help="write results as JSON to this path")
    a = ap.parse_args()
    out = run(n_blocks=64 if a.quick else 256, repeats=3)
    print(f"{'metric':<24}{'value':>18}")
    for k, v in out.items():
        print(f"{k:<24}{v:>18,}")
    print(f"{'tcp vs baseline':<24}{out['tcp_bytes_per_s'] / out['baseline_bytes_per_s']:>17.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
