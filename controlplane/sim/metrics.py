"""Summaries of a run: the per-policy figures of the JSON report.

TTFT and hit-rate figures leave out the requests that arrived in the first ``warmup_s`` seconds
(every run starts with empty caches, and that cold start would otherwise set every policy's p99);
the same figures over the whole run are kept under ``whole_run``. Byte, VRAM and replica figures
are over the whole run (a copy made in the warm-up still cost its bytes).
"""

from __future__ import annotations

import numpy as np

from controlplane.sim.cluster import RunResult

# A run whose engines still queue this long (mean, seconds) when its last request arrives has
# been past its capacity: its queues, not its policy, set its TTFT.
SATURATED_BACKLOG_S = 30.0


def _ttft(ttft: np.ndarray, cached: np.ndarray, inputs: np.ndarray) -> dict:
    n = len(ttft)
    pct = (lambda q: float(np.percentile(ttft, q))) if n else (lambda q: 0.0)
    return {
        "requests": int(n),
        "ttft_mean_s": float(ttft.mean()) if n else 0.0,
        "ttft_p50_s": pct(50),
        "ttft_p90_s": pct(90),
        "ttft_p99_s": pct(99),
        "hit_rate_tokens": float(cached.sum() / max(1, inputs.sum())),
    }


def summarize(
    r: RunResult, kv_capacity_bytes_total: float, duration_s: float, warmup_s: float = 0.0
) -> dict:
    if warmup_s < 0:
        raise ValueError("warm-up must be >= 0 seconds")
    whole = _ttft(r.ttft, r.cached_tokens, r.input_tokens)
    if warmup_s > 0 and r.arrivals is not None:
        sel = r.arrivals >= warmup_s
        if not sel.any():
            raise ValueError(
                f"a {warmup_s:g} s warm-up leaves no request of this "
                f"{duration_s:g} s run to measure; use a shorter --warmup"
            )
        measured = _ttft(r.ttft[sel], r.cached_tokens[sel], r.input_tokens[sel])
    else:
        measured = whole
    spec = [x for x in r.replicas if x.speculative]
    tracked = spec if spec else r.replicas
    precision = None
    if tracked:
        used = sum(1 for x in tracked if r.replica_used.get(x.rid, False))
        precision = used / len(tracked)
    denom = kv_capacity_bytes_total * max(duration_s, 1e-9)
    peak_spec = max((s["spec_bytes"] for s in r.samples), default=0.0)
    return {
        **measured,
        "warmup_s": float(warmup_s),
        "whole_run": whole,
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
        **({"guard": r.guard} if r.guard else {}),
        **({"ingest": r.ingest} if r.ingest else {}),
        # The value model against what the planned copies served (``sim.valued``): the ratio
        # measured / modelled over every kind, and per kind and term.
        **({"value_ratio": r.value["ratio"], "value_model": r.value} if r.value else {}),
        "backlog_end_s": float(r.backlog_s),
        "saturated": bool(r.backlog_s > SATURATED_BACKLOG_S),
        "wall_s": float(r.wall_s),
    }
