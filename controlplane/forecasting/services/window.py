"""The demand window a forecast worker keeps between ticks: every active key's requests per bucket,
right-aligned at the tick's end, read in full once and then only the buckets since the last tick."""

from __future__ import annotations

import math

import numpy as np
from django.conf import settings

from controlplane.demand.models import HistoryImport

from .storage import rows_between

#: Buckets before the previous tick's end that a tick reads again (request records that arrive
#: after their bucket closed: a gateway's batch, a retried post).
REREAD_BUCKETS = 3
#: A worker's window older than this is read again in full (late records beyond the re-read).
WINDOW_MAX_AGE_S = 3600.0


def tick_buckets(bucket_s: int) -> int:
    """Columns of the tick's window: PREWARM_FORECAST_TICK_DAYS, at least 2 buckets."""
    return max(2, int(settings.PREWARM_FORECAST_TICK_DAYS * 86400 // bucket_s))


class DemandWindow:
    """Requests per bucket of every active key over the tick's window, right-aligned at ``end``
    (``core.forecast.arrays``), and each key's first bucket; kept in the worker process between
    ticks so a tick reads only what is new."""

    def __init__(self, bucket_s: int, width: int) -> None:
        self.bucket_s, self.width = bucket_s, width
        self.end = -math.inf
        self.loaded_at = -math.inf
        self.key_ids = np.zeros(0, np.int64)
        self.y = np.zeros((0, width))
        self.first = np.zeros(0)  # unix time of each key's first bucket seen
        self.history_id = 0  # the newest history import when the window was read in full

    def lengths(self) -> np.ndarray:
        seen = np.isfinite(self.first)
        n = np.zeros(len(self.first), np.int64)
        n[seen] = np.round((self.end - self.first[seen]) / self.bucket_s)
        return np.clip(n, 0, self.width)

    def _put(self, keys: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> None:
        if not len(self.key_ids) or not len(keys):
            return  # no active key, or nothing read: nothing to place
        rows = np.searchsorted(self.key_ids, keys)
        ok = (rows < len(self.key_ids)) & (
            self.key_ids[np.minimum(rows, len(self.key_ids) - 1)] == keys
        )
        col = self.width - np.round((self.end - starts) / self.bucket_s).astype(np.int64)
        ok &= (col >= 0) & (col < self.width)
        self.y[rows[ok], col[ok]] = counts[ok]
        np.minimum.at(self.first, rows[ok], starts[ok])

    def refresh(self, key_ids: list[int], end: float, now: float, history_id: int = 0) -> str:
        """Bring the window to ``end`` for these keys; returns "full" or "incremental". A
        history import newer than the last full read (``history_id``) adds buckets anywhere in
        the window: read it in full."""
        ids = np.array(sorted(set(key_ids)), dtype=np.int64)
        b, w = self.bucket_s, self.width
        shift = int(round((end - self.end) / b)) if math.isfinite(self.end) else w
        full = (
            shift >= w
            or shift < 0
            or now - self.loaded_at > WINDOW_MAX_AGE_S
            or history_id != self.history_id
        )
        old_ids, old_y, old_first = self.key_ids, self.y, self.first
        self.key_ids, self.end = ids, end
        self.y = np.zeros((len(ids), w))
        self.first = np.full(len(ids), np.inf)
        if full:
            self._put(*rows_between(end - w * b, end, b))
            self.loaded_at, self.history_id = now, history_id
            return "full"
        # Carry the keys we had, shifted left by the buckets since the last tick.
        pos = np.searchsorted(old_ids, ids)
        had = (pos < len(old_ids)) & (old_ids[np.minimum(pos, max(len(old_ids) - 1, 0))] == ids)
        if len(old_ids):
            src = pos[had]
            self.y[had, : w - shift] = old_y[src, shift:]
            self.first[had] = old_first[src]
        since = end - (shift + REREAD_BUCKETS) * b
        self._put(*rows_between(since, end, b))
        new = ids[~had]
        if len(new):  # keys first seen now: their whole window
            self._put(*rows_between(end - w * b, end, b, key_ids=new.tolist()))
        return "incremental"


_WINDOWS: dict[tuple[int, int], DemandWindow] = {}


def reset_windows() -> None:
    """Forget this process's demand windows (the next tick reads its window in full)."""
    _WINDOWS.clear()


def demand_window(key_ids: list[int], end: float, now: float) -> tuple[DemandWindow, str]:
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    width = tick_buckets(bucket_s)
    window = _WINDOWS.setdefault((bucket_s, width), DemandWindow(bucket_s, width))
    newest = HistoryImport.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    return window, window.refresh(key_ids, end, now, newest)
