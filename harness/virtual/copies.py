"""Copies the control plane ordered, as the virtual engines see them land.

Agents move block files between the engines' block stores; ``apply_store_changes`` finds what
arrived in (or vanished from) each store and makes the engine's simulated cache agree: arrived
blocks are placed as a speculative replica (or as an allocation when there is no such room),
vanished ones removed, and both published as KV events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.sim.engine import GONE

if TYPE_CHECKING:
    from harness.virtual.engine import VirtualEngine
    from harness.virtual.stats import Stats
    from harness.virtual.tokens import TokenBook

REPLICA_IDS_FROM = 1 << 40  # replica ids for placements; the simulator's own count from 0


class Copies:
    def __init__(self, engines: list[VirtualEngine], book: TokenBook, stats: Stats):
        self.engines, self.book, self.stats = engines, book, stats
        self._next_rid = REPLICA_IDS_FROM

    def apply_store_changes(self, t: float) -> None:
        """Blocks copied in by agents join their engine's cache; evicted ones leave it."""
        for ve in self.engines:
            arrived, vanished = ve.scan_store()
            cache = ve.sim.cache
            if vanished:
                before = set(cache.blocks)
                cache.remove(vanished, t)
                ve.publish_changes(before, [])
            if not arrived or ve.sim.state == GONE:
                continue
            for chain in self.chains(arrived):
                before = set(cache.blocks)
                rid = self._next_rid
                self._next_rid += 1
                if not cache.place(chain, t, rid, speculative=True):
                    # No free or speculative room: the engine makes room as an allocation does.
                    cache.place(chain, t, rid, speculative=False)
                ve.publish_changes(before, chain)
                placed = sum(1 for k in chain if k in cache.blocks and k not in before)
                self.stats.replicas_placed += 1 if placed else 0
                self.stats.copies_in_blocks += len(chain)
            self.stats.copies_in_bytes = sum(x.copy_bytes_in for x in self.engines)
            self.stats.copies_rejected = sum(x.bad_copies for x in self.engines)

    def chains(self, keys: list[int]) -> list[tuple[int, ...]]:
        """Arrived keys grouped into chains (root first) by their prefix of origin."""
        by_ns: dict[int, list[tuple[int, int]]] = {}
        for k in keys:
            ns, b, _ = self.book.origin[k]
            by_ns.setdefault(ns, []).append((b, k))
        return [tuple(k for _, k in sorted(v)) for v in by_ns.values()]

    def replicas_used(self) -> int:
        """Placed replicas a request has used since."""
        return sum(
            1
            for ve in self.engines
            for rid, u in ve.sim.cache.replica_used.items()
            if rid >= REPLICA_IDS_FROM and u
        )
