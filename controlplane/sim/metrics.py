"""Summaries of a run: the per-policy figures of the JSON report."""

from __future__ import annotations

import numpy as np

from controlplane.sim.cluster import RunResult


def summarize(r: RunResult, kv_capacity_bytes_total: float, duration_s: float) -> dict:
    ttft = r.ttft
    n = len(ttft)
    pct = (lambda q: float(np.percentile(ttft, q))) if n else (lambda q: 0.0)
    spec = [x for x in r.replicas if x.speculative]
    tracked = spec if spec else r.replicas
    precision = None
    if tracked:
        used = sum(1 for x in tracked if r.replica_used.get(x.rid, False))
        precision = used / len(tracked)
    denom = kv_capacity_bytes_total * max(duration_s, 1e-9)
    peak_spec = max((s["spec_bytes"] for s in r.samples), default=0.0)
    return {
        "requests": int(n),
        "ttft_mean_s": float(ttft.mean()) if n else 0.0,
        "ttft_p50_s": pct(50),
        "ttft_p90_s": pct(90),
        "ttft_p99_s": pct(99),
        "hit_rate_tokens": float(r.cached_tokens.sum() / max(1, r.input_tokens.sum())),
        "bytes_moved": int(r.bytes_moved),
        "spec_vram_byte_seconds": float(r.spec_block_seconds),
        "spec_vram_fraction_mean": float(r.spec_block_seconds / denom) if denom else 0.0,
        "spec_vram_fraction_peak": float(peak_spec / kv_capacity_bytes_total)
        if kv_capacity_bytes_total
        else 0.0,
        "replicas": len(r.replicas),
        "speculative_replicas": len(spec),
        "replica_precision": precision,
        "plan_items": r.plan_items,
        "wall_s": float(r.wall_s),
    }
