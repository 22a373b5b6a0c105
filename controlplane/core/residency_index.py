"""The cluster-wide residency index: which engines hold which canonical KV blocks, per tier.

This is the control plane's view, rebuilt from agent reports (deltas and snapshots). It is not an
engine's own cache model (that is `controlplane.core.prefix_cache`, used by the simulator): engines
evict by themselves and agents report what happened.

Two implementations share one interface and one test-suite: `InProcessResidencyIndex` (embedded
default, tests, simulator) and `RedisResidencyIndex` (production: shared by every web and worker
process). Engines are identified by an int (the control plane's Engine id).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Protocol

from wire.protocol import TIER_RANK, TIERS

MEDIA = TIERS
# Lower rank = faster tier (TIER_RANK); a block held in several tiers of one engine counts at its
# fastest.
BIT = {m: 1 << i for i, m in enumerate(MEDIA)}
# The fastest medium present in each non-empty mask.
FASTEST = {mask: next(m for m in MEDIA if mask & BIT[m]) for mask in range(1, 1 << len(MEDIA))}

Stored = tuple[int, int | None, str]  # (key, parent key or None, medium)
Removed = tuple[int, str]  # (key, medium)


@dataclass(frozen=True)
class Delta:
    """One engine's residency change, as an agent report carries it."""

    engine: int
    stored: Sequence[Stored] = ()
    removed: Sequence[Removed] = ()
    cleared: bool = False
    snapshot: bool = False  # replace everything held for this engine


@dataclass(frozen=True)
class Holder:
    """An engine holding the first ``depth`` blocks of a queried prefix, at its slowest tier."""

    engine: int
    depth: int
    tier: str


@dataclass
class EngineUsage:
    """Blocks held by one engine, per medium."""

    blocks: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.blocks.values())


def validate_medium(medium: str) -> str:
    if medium not in TIER_RANK:
        raise ValueError(f"unknown medium {medium!r}; expected one of {', '.join(MEDIA)}")
    return medium


class ResidencyIndex(Protocol):
    """What every residency index offers."""

    def apply(self, deltas: Iterable[Delta]) -> int:
        """Apply deltas atomically, in order; returns the number of block changes applied."""
        ...

    def holders(self, keys: Sequence[int], limit: int = 16) -> list[Holder]:
        """Engines holding the longest prefix of ``keys`` (root first), deepest first."""
        ...

    def holders_many(self, chains: Sequence[Sequence[int]], limit: int = 16) -> list[list[Holder]]:
        """``holders`` for many chains at once (a plan cycle asks for every prefix): one pass,
        batched round trips, instead of one call per chain."""
        ...

    def full_holders_many(
        self, chains: Sequence[Sequence[int]], limit: int = 16
    ) -> list[list[Holder]]:
        """For each chain, only the engines holding all of it (``holders`` filtered to
        ``depth == len(chain)``, same order): what a planner copies from. Walks from the leaf, so
        a chain costs one lookup per block for its few full holders."""
        ...

    def engines_of(self, key: int) -> dict[int, str]:
        """Engine -> fastest medium for one block."""
        ...

    def usage(self, engine: int) -> EngineUsage: ...

    def engines(self) -> list[int]: ...

    def blocks_of(self, engine: int) -> dict[int, str]:
        """Every block an engine holds, key -> fastest medium."""
        ...

    def parent_of(self, key: int) -> int | None: ...

    def drop_engine(self, engine: int) -> None:
        """Forget an engine entirely (stale node, engine restart)."""
        ...

    def clear(self) -> None: ...

    def mark_live(self) -> bool:
        """Mark the index as holding the cluster's residency. True when it was not marked: the
        index is new or lost its contents (a Redis restarted empty), so every engine's residency
        must be sent again as a snapshot."""
        ...

    def removed_at_many(self, pairs: Sequence[tuple[int, int]]) -> list[float | None]:
        """For each (engine, key): when the engine last removed that block (unix seconds, a
        delta's ``removed`` row that took it off the engine), or None. Removals are kept
        ``removal_window_s`` and at most ``removal_cap`` per engine (the oldest go first)."""
        ...


def longest_prefix(
    keys: Sequence[int], engines_of: Callable[[int], dict[int, str]], limit: int
) -> list[Holder]:
    """Walk ``keys`` root first; an engine's depth ends at the first block it lacks."""
    alive: dict[int, str] | None = None  # engine -> slowest tier seen along the prefix
    depth_of: dict[int, tuple[int, str]] = {}
    for depth, key in enumerate(keys, start=1):
        here = engines_of(key)
        if alive is None:
            alive = dict(here)
        else:
            nxt = {}
            for engine, tier in alive.items():
                medium = here.get(engine)
                if medium is None:
                    continue
                nxt[engine] = tier if TIER_RANK[tier] >= TIER_RANK[medium] else medium
            alive = nxt
        if not alive:
            break
        for engine, tier in alive.items():
            depth_of[engine] = (depth, tier)
    ranked = sorted(
        depth_of.items(), key=lambda item: (-item[1][0], TIER_RANK[item[1][1]], item[0])
    )
    return [Holder(engine, depth, tier) for engine, (depth, tier) in ranked[:limit]]


# Rank of the fastest medium in each mask (the in-process index stores masks).
MASK_RANK = {mask: TIER_RANK[m] for mask, m in FASTEST.items()}


def full_holders(
    keys: Sequence[int], lookup: Callable[[int], dict | None], rank: dict, limit: int
) -> list[Holder]:
    """Engines holding every block of ``keys``, at their slowest tier, ranked as
    ``longest_prefix`` ranks them. ``lookup(key)`` gives engine -> medium value (or None) and
    ``rank`` maps a medium value to its tier rank."""
    if not keys:
        return []
    leaf = lookup(keys[-1])
    if not leaf:
        return []
    # The leaf has few holders (usually one or two): check each one's path up to the root.
    ancestors = [lookup(key) or {} for key in keys[:-1]]
    worst = []
    for engine, medium in leaf.items():
        r = rank[medium] if medium else None
        for here in ancestors:
            if r is None:
                break
            medium = here.get(engine)
            r = max(r, rank[medium]) if medium else None
        if r is not None:
            worst.append((r, engine))
    worst.sort()
    return [Holder(engine, len(keys), MEDIA[r]) for r, engine in worst[:limit]]


_MEDIUM_OF_STORED = itemgetter(2)
_MEDIUM_OF_REMOVED = itemgetter(1)
# How long, and how many per engine, the index keeps the blocks each engine removed (what the
# miss reasons call ``evicted``); both indexes take them as constructor arguments.
REMOVAL_WINDOW_S = 900.0
REMOVAL_CAP = 20_000


class InProcessResidencyIndex:
    """Residency in dictionaries of this process (embedded default, tests, simulator).

    Media are kept as bitmasks (GPU=1, CPU=2, DISK=4): a report of thousands of deltas is a few
    dict operations per block, with no per-block set objects.
    """

    def __init__(
        self,
        removal_window_s: float = REMOVAL_WINDOW_S,
        removal_cap: int = REMOVAL_CAP,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # key -> engine -> media mask; engine -> key -> media mask; key -> parent (of the keys
        # some engine holds: a block that left every engine takes its parent with it, or the map
        # grew by every request's own blocks for as long as the process ran)
        self._by_key: dict[int, dict[int, int]] = {}
        self._by_engine: dict[int, dict[int, int]] = {}
        self._parent: dict[int, int | None] = {}
        self._live = False
        # engine -> key -> when it left the engine, oldest first (re-inserted on each removal)
        self._removed: dict[int, dict[int, float]] = {}
        self.removal_window_s, self.removal_cap, self.clock = removal_window_s, removal_cap, clock

    def apply(self, deltas: Iterable[Delta]) -> int:
        deltas = list(deltas)
        for delta in deltas:  # validate everything first: all or nothing
            # The distinct media, collected in C (map/set), not by a Python loop over every row.
            for medium in set(map(_MEDIUM_OF_STORED, delta.stored)) | set(
                map(_MEDIUM_OF_REMOVED, delta.removed)
            ):
                if medium not in BIT:
                    validate_medium(medium)
        changes = 0
        by_key, parents = self._by_key, self._parent
        by_key_get, bits = by_key.get, BIT
        now = self.clock() if any(d.removed for d in deltas) else 0.0
        for delta in deltas:
            engine = delta.engine
            if delta.snapshot or delta.cleared:
                self.drop_engine(engine)
            held = self._by_engine.setdefault(engine, {})
            held_get = held.get
            roots = []
            for key, parent, medium in delta.stored:
                mask = held_get(key, 0) | bits[medium]
                held[key] = mask
                engines = by_key_get(key)
                if engines is None:
                    by_key[key] = {engine: mask}
                else:
                    engines[engine] = mask
                if parent is None:
                    roots.append(key)
                else:
                    parents[key] = parent
            # A root is recorded once, never over a known parent (as before, in one C call).
            for key in roots:
                parents.setdefault(key, None)
            changes += len(delta.stored)
            for key, medium in delta.removed:
                bit = BIT[medium]
                mask = held.get(key, 0)
                if not mask & bit:
                    continue  # removing what we never saw is harmless (resync races)
                mask &= ~bit
                engines = by_key[key]
                if mask:
                    held[key] = engines[engine] = mask
                else:
                    del held[key]
                    del engines[engine]
                    if not engines:
                        del by_key[key]
                        parents.pop(key, None)  # nobody holds it: its parent goes with it
                    self._note_removed(engine, key, now)
                changes += 1
        return changes

    def _note_removed(self, engine: int, key: int, now: float) -> None:
        gone = self._removed.get(engine)
        if gone is None:
            gone = self._removed[engine] = {}
        gone.pop(key, None)
        gone[key] = now
        if len(gone) > self.removal_cap or next(iter(gone.values())) < now - self.removal_window_s:
            oldest = now - self.removal_window_s
            while gone and (len(gone) > self.removal_cap or next(iter(gone.values())) < oldest):
                del gone[next(iter(gone))]

    def removed_at_many(self, pairs: Sequence[tuple[int, int]]) -> list[float | None]:
        oldest = self.clock() - self.removal_window_s
        out: list[float | None] = []
        for engine, key in pairs:
            at = self._removed.get(engine, {}).get(key)
            out.append(at if at is not None and at >= oldest else None)
        return out

    def engines_of(self, key: int) -> dict[int, str]:
        return {e: FASTEST[m] for e, m in self._by_key.get(key, {}).items()}

    def holders(self, keys: Sequence[int], limit: int = 16) -> list[Holder]:
        return longest_prefix(keys, self.engines_of, limit)

    def holders_many(self, chains: Sequence[Sequence[int]], limit: int = 16) -> list[list[Holder]]:
        return [longest_prefix(keys, self.engines_of, limit) for keys in chains]

    def full_holders_many(
        self, chains: Sequence[Sequence[int]], limit: int = 16
    ) -> list[list[Holder]]:
        lookup = self._by_key.get
        return [full_holders(keys, lookup, MASK_RANK, limit) for keys in chains]

    def usage(self, engine: int) -> EngineUsage:
        # Count the (at most 7) distinct masks in C, then split them into media.
        counts: dict[str, int] = {}
        for mask, n in Counter(self._by_engine.get(engine, {}).values()).items():
            for medium, bit in BIT.items():
                if mask & bit:
                    counts[medium] = counts.get(medium, 0) + n
        return EngineUsage(counts)

    def engines(self) -> list[int]:
        return sorted(e for e, held in self._by_engine.items() if held)

    def blocks_of(self, engine: int) -> dict[int, str]:
        return {k: FASTEST[m] for k, m in self._by_engine.get(engine, {}).items()}

    def parent_of(self, key: int) -> int | None:
        return self._parent.get(key)

    def drop_engine(self, engine: int) -> None:
        for key in self._by_engine.pop(engine, {}):
            engines = self._by_key.get(key)
            if engines is not None:
                engines.pop(engine, None)
                if not engines:
                    del self._by_key[key]
                    self._parent.pop(key, None)

    def clear(self) -> None:
        self._by_key.clear()
        self._by_engine.clear()
        self._parent.clear()
        self._removed.clear()
        self._live = False

    def mark_live(self) -> bool:
        was, self._live = self._live, True
        return not was
