"""One simulated engine: a FIFO prefill queue, a KV cache in tiers, a network link.

Engines are prefill servers (TTFT is what replication changes; decode runs elsewhere, as in
Mooncake's disaggregated prefill pool). Requests are served in arrival order, so the queue is a
single number: the time the engine drains (``free_at``). Blocks a request computes are entered
into the cache when it is routed: any later request on this engine starts after it finishes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from controlplane.core.prefix_cache import PrefixCache
from wire import protocol

# The simulator's lifecycle: the fleet's warming and serving, plus not yet announced and gone.
PLANNED, WARMING, SERVING, GONE = (
    "planned",
    protocol.ENGINE_WARMING,
    protocol.ENGINE_SERVING,
    "gone",
)


@dataclass
class OffloadTier:
    """A KV tier below the GPU (CPU DRAM, SSD): capacity and promotion bandwidth to HBM."""

    name: str  # wire.protocol.TIER_CPU or TIER_DISK
    cache: PrefixCache
    bytes_per_s: float


@dataclass(eq=False)
class Engine:
    eid: int
    node: int
    cache: PrefixCache
    tiers: list[OffloadTier] = field(default_factory=list)
    free_at: float = 0.0
    link_free_at: float = 0.0  # the link drains all copies
    demand_free_at: float = 0.0  # the link drains on-demand copies (they go first)
    state: str = SERVING
    serving_since: float = 0.0
    busy_s: float = 0.0
    served: int = 0
    # Keys of copies in flight to this engine -> time they land.
    pending: dict[int, float] = field(default_factory=dict)
    # (arrival, finish) of requests routed here, oldest first (finished ones dropped lazily).
    queue: deque = field(default_factory=deque)

    def refresh_busy(self, now: float) -> None:
        """Tell the cache which blocks running or waiting requests reference: those used since
        the arrival of the oldest request not finished by ``now`` (FIFO)."""
        q = self.queue
        while q and q[0][1] <= now:
            q.popleft()
        self.cache.busy_since = q[0][0] if q else float("inf")

    @property
    def name(self) -> str:
        return f"e{self.eid}"

    def wait(self, now: float) -> float:
        return self.free_at - now if self.free_at > now else 0.0

    def match(
        self, keys: tuple[int, ...], start: float
    ) -> tuple[int, list[tuple[OffloadTier, int]]]:
        """Blocks of ``keys`` on HBM (or landing there by ``start``), then per lower tier."""
        m = self.cache.match(keys)
        n = len(keys)
        if m < n and self.pending:
            pending = self.pending
            while m < n and pending.get(keys[m], float("inf")) <= start:
                m += 1
        lower: list[tuple[OffloadTier, int]] = []
        if m < n and self.tiers:
            pos = m
            for tier in self.tiers:
                blocks = tier.cache.blocks
                k = 0
                while pos + k < n and keys[pos + k] in blocks:
                    k += 1
                if k:
                    lower.append((tier, k))
                    pos += k
        return m, lower

    def demote(self, evicted: list[int], now: float) -> None:
        """Blocks evicted from HBM go down a tier (and from there to the next one)."""
        for tier in self.tiers:
            if not evicted:
                return
            evicted = tier.cache.use(evicted, now)
