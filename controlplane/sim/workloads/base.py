"""The request table every loader produces, columnar so replay stays fast.

A request ``i`` arrives at ``t[i]`` (seconds from the start of the run) and its prompt is the
shared prefix ``prefixes[pid[i]]`` (a chain of canonical keys of ``BLOCK_TOKENS``-token blocks)
followed by ``suffix_tokens[i]`` tokens of its own. Requests that share a prefix share the tuple.
``prefix_wkey[pid]`` is the workload key demand is forecast for (tenant, repository, chat).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Mooncake's hash_ids cover 512-token blocks; every workload uses that block size so one block
# of one workload is as big as a block of another.
BLOCK_TOKENS = 512


@dataclass
class Workload:
    name: str
    t: np.ndarray  # float64 arrival seconds, sorted
    pid: np.ndarray  # int32 index into prefixes
    suffix_tokens: np.ndarray  # int32 prompt tokens after the shared prefix
    output_tokens: np.ndarray  # int32
    prefixes: list[tuple[int, ...]]
    prefix_wkey: list[str]
    assumptions: dict[str, str] = field(default_factory=dict)
    # Past demand per workload key before t=0 (bucketed counts), for forecasters.
    history: dict[str, np.ndarray] = field(default_factory=dict)
    history_bucket_s: float = 600.0
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.t)
        if not (len(self.pid) == len(self.suffix_tokens) == len(self.output_tokens) == n):
            raise ValueError("workload columns differ in length")
        if n and np.any(np.diff(self.t) < 0):
            raise ValueError("arrival times must be sorted")
        if not self.duration_s:
            self.duration_s = float(self.t[-1]) if n else 0.0

    def __len__(self) -> int:
        return len(self.t)

    def prefix_tokens(self, pid: int) -> int:
        return len(self.prefixes[pid]) * BLOCK_TOKENS

    def input_tokens(self) -> np.ndarray:
        lens = np.array([len(p) for p in self.prefixes], dtype=np.int64) * BLOCK_TOKENS
        return lens[self.pid] + self.suffix_tokens

    def window(self, start: float, duration: float | None) -> Workload:
        """The requests in ``[start, start + duration)``, re-timed to start at 0."""
        hi = np.inf if duration is None else start + duration
        sel = (self.t >= start) & (self.t < hi)
        return Workload(
            self.name,
            self.t[sel] - start,
            self.pid[sel],
            self.suffix_tokens[sel],
            self.output_tokens[sel],
            self.prefixes,
            self.prefix_wkey,
            dict(self.assumptions),
            self.history,
            self.history_bucket_s,
            duration_s=float(duration) if duration is not None else 0.0,
        )

    def scaled(self, time_scale: float) -> Workload:
        """Arrivals with time divided by ``time_scale`` (2.0 = twice as fast)."""
        if time_scale <= 0:
            raise ValueError("time scale must be > 0")
        w = Workload(
            self.name,
            self.t / time_scale,
            self.pid,
            self.suffix_tokens,
            self.output_tokens,
            self.prefixes,
            self.prefix_wkey,
            dict(self.assumptions),
            self.history,
            self.history_bucket_s,
            duration_s=self.duration_s / time_scale,
        )
        w.assumptions["time_scale"] = f"arrival times divided by {time_scale:g}"
        return w
