"""Benchmark: vLLM KV-event batches decoded, mapped to canonical keys and applied to residency.

Input: the real vLLM messages in ``../shared/data/vllm-kv-events/`` (both encodings), replayed
many times with fresh block hashes per round so every store is new work. Baseline: plain msgpack
decode of the same payloads in the same run. Target: >= 300k block events/s on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodeagent.engine_residency import EngineResidency  # noqa: E402
from nodeagent.kvevents import decode_payload  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PREWARM_SHARED_DATA", REPO.parent / "shared" / "data"))


def rehash(payload: bytes, salt: int) -> bytes:
    """The same batch with block hashes shifted per round (new blocks, same shape)."""
    ts, events, rank = msgpack.unpackb(payload)

    def shift(h):
        return None if h is None else (h + salt) & ((1 << 64) - 1)

    out = []
    for ev in events:
        if isinstance(ev, dict):
            ev = dict(ev)
            if "block_hashes" in ev:
                ev["block_hashes"] = [shift(h) for h in ev["block_hashes"]]
            if "parent_block_hash" in ev:
                ev["parent_block_hash"] = shift(ev["parent_block_hash"])
        elif ev[0] in ("BlockStored", "BlockRemoved"):
            ev = list(ev)
            ev[1] = [shift(h) for h in ev[1]]
            if ev[0] == "BlockStored":
                ev[2] = shift(ev[2])
        out.append(ev)
    return msgpack.packb([ts, out, rank])


def workload(rounds: int) -> tuple[list[bytes], int]:
    payloads = []
    for version in ("0.10.1", "0.33.0"):
        frames = msgpack.unpackb(
            (SHARED / "vllm-kv-events" / f"vllm-{version}.frames.msgpack").read_bytes()
        )
        base = [p for _t, _s, p in frames]
        for r in range(rounds):
            payloads.extend(rehash(p, r * 1_000_003) for p in base)
    return payloads, 0


def run(rounds: int, repeats: int) -> dict:
    payloads, _ = workload(rounds)
    best_agent = best_base = 0.0
    events = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in payloads:
            msgpack.unpackb(p, raw=False)
        base = time.perf_counter() - t0
        res = EngineResidency("vllm-0", 16)
        t0 = time.perf_counter()
        for p in payloads:
            res.apply_events(decode_payload(p)[1])
        agent = time.perf_counter() - t0
        events = res.stats.block_events
        best_agent = max(best_agent, events / agent)
        best_base = max(best_base, events / base)
    return {
        "block_events": events,
        "batches": len(payloads),
        "block_events_per_s": round(best_agent),
        "baseline_decode_per_s": round(best_base),
        "target_block_events_per_s": 300_000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    ap.add_argument("--json", help="write results as JSON to this path")
    a = ap.parse_args()
    out = run(rounds=20 if a.quick else 200, repeats=3 if a.quick else 5)
    print(f"{'metric':<28}{'value':>14}")
    for k, v in out.items():
        print(f"{k:<28}{v:>14,}")
    print(f"{'agent vs target':<28}{out['block_events_per_s'] / 300_000:>13.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
