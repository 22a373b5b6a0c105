"""The agent's retry pacing: exponential backoff with full jitter, shared by the reporter, the
record spool and the job channel."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with full jitter."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None):
        self.initial_s = initial_s
        self.max_s = max_s
        self.failures = 0
        self.rng = rng or random.Random()

    def next_delay(self) -> float:
        self.failures += 1
        cap = min(self.max_s, self.initial_s * 2 ** (self.failures - 1))
        return self.rng.uniform(cap / 2, cap)

    def reset(self) -> None:
        self.failures = 0
