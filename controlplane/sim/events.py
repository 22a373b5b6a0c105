"""Timed actions of a run (copies landing, engines joining or leaving, planner ticks).

Arrivals are not events here: the run walks the arrival column in order and, before each
arrival, applies every action due by then. Ties keep insertion order, so a run is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = count()

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), action))

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def run_until(self, t: float) -> None:
        """Apply every action due at or before ``t`` (actions may schedule more)."""
        heap = self._heap
        while heap and heap[0][0] <= t:
            when, _, action = heapq.heappop(heap)
            action(when)
