"""Per-engine KV-block residency, keyed by canonical block keys, with deltas for reports.

vLLM names blocks by per-process hashes; the control plane joins on canonical keys
(``wire.blockhash``). A ``BlockStored`` event carries the token ids of every block
it stores (concatenated, ``block_size`` per block) and the engine hash of the first block's
parent, so the canonical key of each block is ``block_key(canonical parent, its tokens, extra)``.
The engine-hash -> canonical-key map holds the blocks resident on some medium of the engine; a
block that leaves every medium moves to a small map of recently forgotten ones
(``FORGOTTEN_LIMIT``, the newest kept), because a child may be stored after its parent left: vLLM's
offloading connector emits a CPU tier's ``BlockStored`` events in any key order, each with its own
parent. Both maps are dropped when the engine restarts (new hash seed).

Events without token ids (or whose parent is unknown) get engine-scoped keys, flagged with
``FLAG_ENGINE_SCOPED``, so a report never claims a canonical key it cannot back.

Deltas accumulate between reports and are net: a key is never both stored and removed in one
delta; ``cleared`` means "empty this engine before applying the rows".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from nodeagent.kvevents import (
    TIER_OF,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    block_extra,
    engine_hash,
    normalise,
)
from wire.blockhash import (
    ROOT_PARENT,
    block_key,
    engine_scoped_key,
)
from wire.protocol import (
    FLAG_ENGINE_SCOPED,
    MODE_DELTA,
    MODE_SNAPSHOT,
    encode_removed,
    encode_stored,
    residency_entry,
)

__all__ = ["FLAG_ENGINE_SCOPED", "EngineResidency", "EventStats"]
# Mappings of blocks that left every medium, kept for a child stored late (the newest first)
FORGOTTEN_LIMIT = 65_536
ROOTS_KEPT = 8  # first-block hashes kept for the fleet doctor's hash-seed check

# Row of a resident block: (canonical key, canonical parent key or None, flags)
Row = tuple[int, int | None, int]


@dataclass
class EventStats:
    """Counters the metrics endpoint exposes."""

    block_events: int = 0
    batches: int = 0
    engine_scoped: int = 0
    unknown_removals: int = 0


@dataclass
class EngineResidency:
    """Blocks resident on one engine, per medium, plus the pending delta since the last report."""

    engine_id: str
    block_size: int
    blocks: dict[str, dict[int, Row]] = field(default_factory=dict)  # medium -> hash -> row
    canon: dict[int, int] = field(default_factory=dict)  # resident engine hash -> canonical key
    forgotten: dict[int, int] = field(default_factory=dict)  # the same, for blocks that left
    pending_stored: dict[str, dict[int, Row]] = field(default_factory=dict)  # medium -> key -> row
    pending_removed: dict[str, set[int]] = field(default_factory=dict)  # medium -> keys
    pending_cleared: bool = False
    snapshot_needed: bool = True
    stats: EventStats = field(default_factory=EventStats)
    # What the fleet doctor reads (docs/deploy.md, "Troubleshooting KV-aware routing"):
    held: dict[int, int] = field(default_factory=dict)  # canonical key -> media holding it
    # canonical key of a prompt's first block -> the engine's hash of it, the latest few: two
    # engines of one model that hash the same tokens differently disagree on NONE_HASH
    roots: dict[int, int] = field(default_factory=dict)
    event_block_size: int = 0  # the block size the engine's own events carry (0: none yet)
    last_event_at: float = 0.0  # unix time of the last batch applied (0: none yet)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- applying events -------------------------------------------------------------------
    def apply_events(self, raw_events: Iterable[Any]) -> int:
        """Apply one batch of raw (either-encoding) events; returns the block events applied."""
        n = 0
        with self.lock:
            self.stats.batches += 1
            self.last_event_at = time.time()
            for raw in raw_events:
                ev = normalise(raw)
                kind = type(ev)
                if kind is BlockStored:
                    n += self._stored(ev)  # type: ignore[arg-type]
                elif kind is BlockRemoved:
                    n += self._removed(ev.block_hashes, ev.medium, ev.group_idx)  # type: ignore[union-attr]
                elif kind is AllBlocksCleared:
                    self._clear_blocks()
            self.stats.block_events += n
        return n

    def _stored(self, ev: BlockStored) -> int:
        hashes, parent_hash, token_ids = ev.block_hashes, ev.parent_block_hash, ev.token_ids
        lora_id, lora_name, group = ev.lora_id, ev.lora_name, ev.group_idx
        medium = TIER_OF.get(ev.medium, ev.medium)
        if not hashes:
            return 0
        bs = ev.block_size or self.block_size
        if ev.block_size:
            self.event_block_size = ev.block_size
        if not all(type(h) is int for h in hashes):
            hashes = [engine_hash(h) for h in hashes]
        if group:  # a hybrid model's other KV groups reuse the hashes: keep them apart
            hashes = [_in_group(h, group) for h in hashes]
            if parent_hash is not None:
                parent_hash = _in_group(engine_hash(parent_hash), group)
        canon = self.canon
        resident = self.blocks.get(medium)
        if resident is None:
            resident = self.blocks[medium] = {}
        pstore = self.pending_stored.get(medium)
        if pstore is None:
            pstore = self.pending_stored[medium] = {}
        premoved = self.pending_removed.get(medium)
        # Canonical keys need every block's tokens and a known canonical parent, and a LoRA named
        # (an adapter id alone is engine-specific).
        if parent_hash is None:
            parent: int | None = ROOT_PARENT
        else:
            ph = engine_hash(parent_hash)
            parent = canon.get(ph)
            if parent is None:
                parent = self.forgotten.get(ph)
        scoped = (
            parent is None
            or token_ids is None
            or len(token_ids) < bs * len(hashes)
            or (lora_id is not None and not lora_name)
        )
        plain = not (lora_name or group or ev.extra_keys or ev.cache_salt)
        report_parent: int | None = None if parent_hash is None else parent
        if scoped:
            self.stats.engine_scoped += len(hashes)
            report_parent = (
                None
                if parent_hash is None
                else engine_scoped_key(self.engine_id, engine_hash(parent_hash))
            )
        for i, h in enumerate(hashes):
            if scoped:
                key = engine_scoped_key(self.engine_id, h)
                row: Row = (key, report_parent, FLAG_ENGINE_SCOPED)
            else:
                try:
                    extra = b"" if plain else block_extra(ev, i)
                    key = block_key(parent, token_ids[i * bs : (i + 1) * bs], extra)  # type: ignore[index,arg-type]
                except ValueError as exc:  # token ids outside [0, 2**32) or not integers
                    raise EventDecodeError(f"BlockStored: {exc}") from None
                row = (key, report_parent, 0)
                canon[h] = key
                if i == 0 and parent_hash is None:  # a prompt's first block
                    self.roots[key] = h
                    if len(self.roots) > ROOTS_KEPT:
                        del self.roots[next(iter(self.roots))]
            if h not in resident:
                self.held[row[0]] = self.held.get(row[0], 0) + 1
            resident[h] = row
            pstore[key] = row
            if premoved:
                premoved.discard(key)
            report_parent = parent = key
        return len(hashes)

    def _removed(self, hashes: list[Any], medium: str, group: int | None = None) -> int:
        medium = TIER_OF.get(medium, medium)
        resident = self.blocks.get(medium)
        pstore = self.pending_stored.get(medium)
        premoved = self.pending_removed.get(medium)
        if premoved is None:
            premoved = self.pending_removed[medium] = set()
        canon, forgotten = self.canon, self.forgotten
        n = 0
        for raw in hashes:
            h = raw if isinstance(raw, int) else engine_hash(raw)
            if group:
                h = _in_group(h, group)
            row = resident.pop(h, None) if resident else None
            n += 1
            if row is None:
                self.stats.unknown_removals += 1
                continue
            key = row[0]
            left = self.held.pop(key, 1) - 1
            if left > 0:
                self.held[key] = left
            if h in canon and not any(h in rows for rows in self.blocks.values()):
                forgotten.pop(h, None)
                forgotten[h] = canon.pop(h)  # the newest last
                if len(forgotten) > FORGOTTEN_LIMIT:
                    del forgotten[next(iter(forgotten))]
            if pstore and key in pstore:
                del pstore[key]
            premoved.add(key)
        return n

    def _forget(self, mappings: dict[int, int]) -> None:
        """Keep ``mappings`` (of blocks no medium holds any more) among the newest forgotten."""
        forgotten = self.forgotten
        for h, key in list(mappings.items())[-FORGOTTEN_LIMIT:]:
            forgotten.pop(h, None)  # re-inserted: the newest go last
            forgotten[h] = key
        excess = len(forgotten) - FORGOTTEN_LIMIT
        if excess > 0:  # dicts keep insertion order: the oldest go first
            for old in list(islice(forgotten, excess)):
                del forgotten[old]

    def _clear_blocks(self) -> None:
        self._forget(self.canon)
        self.canon.clear()
        self.blocks.clear()
        self.held.clear()
        self.pending_stored.clear()
        self.pending_removed.clear()
        self.pending_cleared = True

    # -- resets ----------------------------------------------------------------------------
    def reset(self, engine_restarted: bool) -> None:
        """Forget everything (lost events or engine restart); the next report is a snapshot.

        The engine-hash mappings of the blocks it held join the forgotten ones (a child of one of
        the newest ``FORGOTTEN_LIMIT`` still gets its canonical key); after an engine restart its hash seed
        changed, so those are dropped too.
        """
        with self.lock:
            self._clear_blocks()
            if engine_restarted:
                self.forgotten.clear()
            self.snapshot_needed = True

    def request_snapshot(self) -> None:
        with self.lock:
            self.snapshot_needed = True

    # -- report entries --------------------------------------------------------------------
    def take_entry(
        self, force_snapshot: bool = False, hex_keys: bool = True
    ) -> dict[str, Any] | None:
        """The residency entry for the next report (delta or snapshot), resetting the delta.

        Rows come from the protocol's encoder: integer keys for msgpack (``hex_keys=False``),
        hex for JSON. Returns None when there is nothing to say (empty delta).
        """
        with self.lock:
            snapshot = force_snapshot or self.snapshot_needed
            source = self.blocks if snapshot else self.pending_stored
            stored = encode_stored(
                (
                    (k, p, medium, f)
                    for medium, rows in source.items()
                    for (k, p, f) in rows.values()
                ),
                hex_keys,
            )
            removed: list[list[Any]] = []
            if not snapshot:
                removed = encode_removed(
                    ((k, medium) for medium, keys in self.pending_removed.items() for k in keys),
                    hex_keys,
                )
            cleared = self.pending_cleared and not snapshot
            self.pending_stored = {}
            self.pending_removed = {}
            self.pending_cleared = False
            self.snapshot_needed = False
        if not snapshot and not stored and not removed and not cleared:
            return None
        return residency_entry(
            self.engine_id, MODE_SNAPSHOT if snapshot else MODE_DELTA, stored, removed, cleared
        )

    def resident_hashes(self, medium: str | None = None) -> set[int]:
        with self.lock:
            if medium is not None:
                return set(self.blocks.get(medium, {}))
            return {h for rows in self.blocks.values() for h in rows}

    def cached_depth(self, keys: list[int]) -> int:
        """How many leading blocks of a prompt's chain this engine holds, as its events say:
        what a router reading them predicts the engine serves from cache."""
        with self.lock:
            n = 0
            for k in keys:
                if k not in self.held:
                    break
                n += 1
            return n

    def block_count(self) -> int:
        with self.lock:
            return sum(len(r) for r in self.blocks.values())


def _in_group(engine_hash: int, group: int) -> int:
    """An engine hash of KV-cache group ``group`` (> 0) as this module keys it: group 0 keeps
    the engine's own hash; others get one that cannot collide with it or with each other's."""
    return engine_scoped_key(f"group:{group}", engine_hash)
