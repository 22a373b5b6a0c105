"""The guarded reactive rule: hot-spot replication after a prefix turns hot.

Mooncake and Preble replicate a prefix once its holders are overloaded. To be a fair baseline
the rule is guarded: copy only when the holder's wait exceeds both ``threshold_s`` and twice the
copy time, never when the copy would land after the holder frees up anyway, and never while a
copy of the same prefix is in flight (so it cannot loop).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReactiveRule:
    threshold_s: float = 1.0  # holder wait that makes a prefix "hot"
    min_blocks: int = 2  # prefixes shorter than this are cheaper to recompute than to track

    def should_copy(self, holder_wait_s: float, copy_s: float, in_flight: bool) -> bool:
        if in_flight or copy_s <= 0:
            return False
        return holder_wait_s > self.threshold_s and holder_wait_s > 2.0 * copy_s
