"""Engine-local prefix cache model: which canonical blocks one engine holds, with LRU eviction.

This models the KV cache *inside* one engine (what vLLM's prefix cache does on a GPU, or one
offload tier beside it). It is distinct from the control plane's cluster-wide residency index
(``controlplane/core/residency_index.py``: block -> engines, longest-prefix lookup across the fleet),
which is built from KV events; the simulator uses this class to play the engines themselves.

Keys are canonical chained keys (``wire/blockhash.py``), so a key already implies
its whole prefix: the radix structure is implicit in the chain, and a prefix match is the number
of leading keys of a request that are present. Touching a chain refreshes it leaf first, so the
root ends up most recent and eviction takes leaves before the blocks they hang from (a cached
block never loses its parent first), as vLLM's free-block queue does.

Blocks are *normal* (computed here, or copied on demand) or *speculative* (placed by a plan and
not yet used). Speculative blocks live in a bounded slice (``spec_limit`` blocks) and count
against VRAM until a request uses them (then they are ordinary cache). When a request needs
room, unused speculative blocks are evicted before any normal block, then LRU; keys under a
lease (``pin``: what a plan decided to keep, an LMCache pin in a real fleet) are passed over
while unpinned blocks remain. Every placed replica is tracked until its first use, so precision
(replicas used at least once / replicas placed) can be scored.

Value-aware placement: a copied replica takes free blocks first, then
cached blocks that no running or waiting request references, cheapest first by expected value
over the horizon (``value_of(key)``: seconds of prefill that block is expected to save; LRU
order breaks ties, and is the whole ranking where the caller has no values), and only while the
displaced value stays below the replica's own (``budget``). vLLM keeps such unreferenced blocks
in its free queue and evicts them LRU-first for any allocation, so a replica loaded through a
connector takes room exactly as a new request does. A block is *referenced* when a request that
is still queued or running used it: the cache keeps the last time a request used each block
(``use``), and the caller sets ``busy_since`` to the arrival of the oldest request still queued
or running on the engine (a FIFO engine's unfinished requests are exactly those that arrived
since). Blocks in use are never displaced.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Sequence

ValueOf = Callable[[int], float]


def leading_match(keys: Sequence[int], blocks: Container[int]) -> int:
    """How many of ``keys``, root first, are in ``blocks`` before the first one that is not."""
    n = 0
    for k in keys:
        if k not in blocks:
            break
        n += 1
    return n


class PrefixCache:
    """LRU cache of canonical block keys for one engine (or one tier of one engine)."""

    __slots__ = (
        "capacity",
        "spec_limit",
        "blocks",
        "spec",
        "owner",
        "replica_used",
        "spec_block_seconds",
        "_spec_since",
        "busy_since",
        "pinned",
        "watched",
        "removed_at",
    )

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        self.capacity = int(capacity_blocks)
        self.spec_limit = self.capacity  # most speculative blocks held at once (the slice)
        # key -> last time a request used it (-inf: placed, never used); LRU first
        self.blocks: OrderedDict[int, float] = OrderedDict()
        self.spec: dict[int, float] = {}  # speculative key -> expiry time
        self.owner: dict[int, int] = {}  # placed (unused) key -> replica id
        self.replica_used: dict[int, bool] = {}  # replica id -> used at least once
        self.spec_block_seconds = 0.0
        self._spec_since = 0.0
        self.busy_since = math.inf  # blocks used at or after this time are referenced
        self.pinned: dict[int, float] = {}  # key -> lease expiry (kept while others can go)
        # Keys whose last removal time is kept (``watch``): what a miss's ``evicted`` reason
        # needs (the engine removed the prefix's first block recently), as the residency index
        # keeps engines' removals.
        self.watched: frozenset[int] = frozenset()
        self.removed_at: dict[int, float] = {}

    def watch(self, keys: Iterable[int]) -> None:
        """Keep the last removal time of each of ``keys`` in ``removed_at``."""
        self.watched = frozenset(keys)

    def _removed(self, keys: Sequence[int], now: float) -> None:
        watched = self.watched
        if watched:
            for k in keys:
                if k in watched:
                    self.removed_at[k] = now

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, key: int) -> bool:
        return key in self.blocks

    @property
    def free(self) -> int:
        return self.capacity - len(self.blocks)

    def spec_room(self, value_of: ValueOf | None = None, budget: float = math.inf) -> int:
        """Blocks a speculative placement could take now: free blocks, speculative blocks and
        unreferenced normal blocks worth less than ``budget`` in all, within the slice."""
        room = self.free + len(self._displaceable(value_of, budget, ()))
        return max(0, min(room, self.spec_limit))

    def displaceable(
        self, n: int, value_of: ValueOf | None = None, exclude: Container[int] = ()
    ) -> tuple[int, float]:
        """How many of ``n`` new blocks fit (free blocks, then unreferenced blocks cheapest
        first) and the expected value the displaced blocks carry."""
        take = max(0, n - self.free)
        if take == 0:
            return n, 0.0
        rows = self._ranked(value_of, exclude)[:take]
        return n - take + len(rows), sum(v for v, _, _ in rows)

    def _ranked(self, value_of: ValueOf | None, exclude: Container[int]) -> list:
        """Unreferenced blocks as (value, LRU position, key), cheapest first."""
        busy = self.busy_since
        spec = self.spec
        rows = []
        pos = 0
        for k, used in self.blocks.items():
            pos += 1
            if used >= busy or k in exclude:
                continue
            # Unused speculative blocks rank by their own value too (a replica placed for a
            # coming burst is worth its forecast); without values they go first.
            v = value_of(k) if value_of is not None else (-1.0 if k in spec else 0.0)
            rows.append((v, pos, k))
        rows.sort()
        return rows

    def _displaceable(self, value_of, budget, exclude) -> list[int]:
        out, total = [], 0.0
        for v, _, k in self._ranked(value_of, exclude):
            if total + max(v, 0.0) >= budget and v > 0:
                break
            total += max(v, 0.0)
            out.append(k)
        return out

    def match(self, keys: Sequence[int]) -> int:
        """Number of leading ``keys`` held here (the cached prefix length in blocks)."""
        return leading_match(keys, self.blocks)

    def _account(self, now: float) -> None:
        # Integrate speculative blocks over time before their count changes.
        if now > self._spec_since:
            self.spec_block_seconds += len(self.spec) * (now - self._spec_since)
            self._spec_since = now

    def use(self, keys: Sequence[int], now: float) -> list[int]:
        """A request used (or computed) ``keys``: insert, refresh, evict LRU; returns evicted."""
        blocks = self.blocks
        if len(keys) > self.capacity:
            keys = keys[: self.capacity]
        owner = self.owner
        if owner:
            for k in keys:
                rid = owner.pop(k, None)
                if rid is not None:
                    self.replica_used[rid] = True
                    if k in self.spec:
                        self._account(now)
                        del self.spec[k]
        move = blocks.move_to_end
        for k in reversed(keys):
            if k in blocks:
                blocks[k] = now
                move(k)
            else:
                blocks[k] = now
        evicted: list[int] = []
        if len(blocks) > self.capacity:
            evicted = self._evict(len(blocks) - self.capacity, now)
        return evicted

    def _evict(self, n: int, now: float) -> list[int]:
        # Unused speculative blocks go first (oldest placed first): the engine needs its own.
        out = []
        if self.spec:
            out = self._drop_spec(min(n, len(self.spec)), now)
            n -= len(out)
        popitem = self.blocks.popitem
        pinned = self.pinned
        passed = 0
        for _ in range(n):
            k, v = popitem(last=False)
            # A lease keeps its block while unleased ones remain (one pass over the cache).
            while pinned and passed < len(self.blocks) and pinned.get(k, -math.inf) > now:
                self.blocks[k] = v
                passed += 1
                k, v = popitem(last=False)
            out.append(k)
            if k in self.owner:
                del self.owner[k]
                if k in self.spec:
                    self._account(now)
                    del self.spec[k]
        self._removed(out, now)
        return out

    def place(
        self,
        keys: Sequence[int],
        now: float,
        replica_id: int,
        speculative: bool,
        expires_at: float = float("inf"),
        value_of: ValueOf | None = None,
        budget: float = math.inf,
        keep_until: float = -math.inf,
    ) -> int:
        """Land a copied replica of ``keys``; returns the number of blocks added (leased until
        ``keep_until``: kept while other blocks can be evicted).

        Room comes from free blocks, then unreferenced blocks cheapest first (module doc) while
        their value stays below ``budget``; a speculative placement also keeps the speculative
        blocks within the slice (``spec_limit``), dropping its oldest speculative blocks when it
        is full. A placement that does not fit adds nothing, except an on-demand copy
        (``speculative=False``), which then evicts like computed blocks (speculative first, LRU).
        """
        missing = [k for k in keys if k not in self.blocks]
        if not missing:
            return 0
        if speculative and len(missing) > self.spec_limit:
            return 0
        exclude = set(keys)
        drop: list[int] = []
        if speculative:
            over = len(self.spec) + len(missing) - self.spec_limit
            if over > 0:
                drop = [k for k in self.spec if k not in exclude][:over]
                if len(drop) < over:
                    return 0
        need = len(missing) - self.free - len(drop)
        victims: list[int] = []
        if need > 0:
            room = self._displaceable(value_of, budget, exclude.union(drop))
            if len(room) < need:
                if speculative:
                    return 0
            else:
                victims = room[:need]
        if drop:
            self._drop_spec_keys(drop, now)
        if victims:
            self._drop_keys(victims, now)
        if speculative:
            self._account(now)
        self.replica_used[replica_id] = False
        blocks = self.blocks
        move = blocks.move_to_end
        for k in reversed(keys):
            if k in blocks:
                move(k)
            else:
                blocks[k] = -math.inf
                self.owner[k] = replica_id
                if speculative:
                    self.spec[k] = expires_at
        if keep_until > now:
            self.pin(keys, keep_until)
        if len(blocks) > self.capacity:
            self._evict(len(blocks) - self.capacity, now)
        return len(missing)

    def _drop_keys(self, keys: Sequence[int], now: float) -> None:
        self._removed(keys, now)
        for k in keys:
            del self.blocks[k]
            if k in self.owner:
                del self.owner[k]
                if k in self.spec:
                    self._account(now)
                    del self.spec[k]

    def _drop_spec_keys(self, keys: Sequence[int], now: float) -> None:
        self._account(now)
        self._removed(keys, now)
        for k in keys:
            del self.spec[k]
            self.owner.pop(k, None)
            del self.blocks[k]

    def pin(self, keys: Sequence[int], until: float) -> None:
        """Keep ``keys`` until ``until`` while unpinned blocks can be evicted instead."""
        for k in keys:
            if k in self.blocks:
                self.pinned[k] = until

    def unpin_expired(self, now: float) -> None:
        if self.pinned:
            self.pinned = {k: t for k, t in self.pinned.items() if t > now and k in self.blocks}

    def _drop_spec(self, n: int, now: float) -> list[int]:
        # Oldest speculative blocks first (dict order is placement order; a replica's leaf
        # first), except those under a lease (a plan keeps them for the burst it placed them for).
        self._account(now)
        pinned = self.pinned
        if pinned:
            gone = [k for k in self.spec if pinned.get(k, -math.inf) <= now][:n]
        else:
            gone = list(self.spec)[:n]
        for k in gone:
            del self.spec[k]
            self.owner.pop(k, None)
            del self.blocks[k]
        self._removed(gone, now)
        return gone

    def expire(self, now: float) -> int:
        """Drop speculative blocks whose TTL has passed; returns how many."""
        if not self.spec:
            return 0
        gone = [k for k, t in self.spec.items() if t <= now]
        if gone:
            self._account(now)
            self._removed(gone, now)
            for k in gone:
                del self.spec[k]
                self.owner.pop(k, None)
                self.blocks.pop(k, None)
        return len(gone)

    def remove(self, keys: Sequence[int], now: float) -> None:
        """Drop ``keys`` (promotion to another tier moves them out of this one)."""
        for k in keys:
            if self.blocks.pop(k, 1) is None:
                if k in self.owner:
                    del self.owner[k]
                    if k in self.spec:
                        self._account(now)
                        del self.spec[k]

    def clear(self, now: float) -> list[int]:
        """Drop every block, as an engine's restart does; returns the keys it held."""
        self._account(now)
        gone = list(self.blocks)
        self.blocks.clear()
        self.spec.clear()
        self.owner.clear()
        self.replica_used.clear()
        self.pinned.clear()
        return gone

    def finish(self, now: float) -> None:
        self._account(now)
