"""Requests a stored forecast expects in a planning horizon: its buckets overlapping the
horizon, pro rata; past its last bucket, its last level. ``expected_many`` is the cycle's
vectorised form (``_expected`` the reference it is tested against)."""

from __future__ import annotations

import numpy as np


def _expected(f, now, horizon: float) -> float:
    """Requests the forecast expects in [now, now + horizon) (buckets overlapping it, pro rata)."""
    t0 = f.start.timestamp()
    a, b = now.timestamp(), now.timestamp() + horizon
    total = 0.0
    for i, y in enumerate(f.yhat):
        lo, hi = t0 + i * f.bucket_s, t0 + (i + 1) * f.bucket_s
        overlap = max(0.0, min(hi, b) - max(lo, a))
        total += max(0.0, float(y)) * overlap / f.bucket_s
    if total == 0.0 and f.yhat and a >= t0 + len(f.yhat) * f.bucket_s:
        total = max(0.0, float(f.yhat[-1])) * horizon / f.bucket_s  # past its horizon: last level
    return total


def expected_many(rows: list, now, horizon: float) -> np.ndarray:
    """``_expected`` of many forecasts: the forecasts of one cycle share start, bucket and
    length, so each such group is one matrix-vector product of its yhat rows with the overlap
    weights of its buckets."""
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(rows):
        groups.setdefault((f.start, f.bucket_s, len(f.yhat)), []).append(i)
    out = np.zeros(len(rows))
    a = now.timestamp()
    for (start, bucket, n), idx in groups.items():
        if n == 0:
            continue
        t0 = start.timestamp()
        lo = t0 + bucket * np.arange(n, dtype=float)
        overlap = np.clip(np.minimum(lo + bucket, a + horizon) - np.maximum(lo, a), 0.0, None)
        y = np.clip(np.array([rows[i].yhat for i in idx], dtype=float), 0.0, None)
        total = y @ (overlap / bucket)
        if a >= t0 + n * bucket:  # past its horizon: the last level
            total = np.where(total == 0.0, y[:, -1] * horizon / bucket, total)
        out[idx] = total
    return out
