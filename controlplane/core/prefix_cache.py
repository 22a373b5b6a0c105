"""Engine-local prefix cache model: which canonical blocks one engine holds, with LRU eviction.

This models the KV cache *inside* one engine (what vLLM's prefix cache does on a GPU, or one
offload tier beside it). It is distinct from the control plane's cluster-wide residency index
(``controlplane/core/residency.py``: block -> engines, longest-prefix lookup across the fleet),
which is built from KV events; the simulator uses this class to play the engines themselves.

Keys are canonical chained keys (``controlplane/core/blockhash.py``), so a key already implies
its whole prefix: the radix structure is implicit in the chain, and a prefix match is the number
of leading keys of a request that are present. Touching a chain refreshes it leaf first, so the
root ends up most recent and eviction takes leaves before the blocks they hang from (a cached
block never loses its parent first), as vLLM's free-block queue does.

Blocks are *normal* (computed here, or copied on demand) or *speculative* (placed by a plan and
not yet used). Speculative blocks live in a bounded slice (``spec_limit`` blocks) and count
against VRAM until a request uses them (then they are ordinary cache). Placing them never evicts
normal blocks: they take free blocks, or the oldest speculative ones. When a request (or an
on-demand copy) needs room, unused speculative blocks are evicted before any normal block.
Every placed replica is tracked until its first use, so precision (replicas used at least once
/ replicas placed) can be scored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence


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
    )

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        self.capacity = int(capacity_blocks)
        self.spec_limit = self.capacity  # most speculative blocks held at once (the slice)
        self.blocks: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.spec: dict[int, float] = {}  # speculative key -> expiry time
        self.owner: dict[int, int] = {}  # placed (unused) key -> replica id
        self.replica_used: dict[int, bool] = {}  # replica id -> used at least once
        self.spec_block_seconds = 0.0
        self._spec_since = 0.0

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, key: int) -> bool:
        return key in self.blocks

    @property
    def free(self) -> int:
        return self.capacity - len(self.blocks)

    def spec_room(self) -> int:
        """Blocks a speculative placement could take now: free blocks plus older speculative
        ones, within the speculative slice."""
        return max(0, min(self.free + len(self.spec), self.spec_limit))

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
                move(k)
            else:
                blocks[k] = None
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
        for _ in range(n):
            k, _v = popitem(last=False)
            out.append(k)
            if k in self.owner:
                del self.owner[k]
                if k in self.spec:
                    self._account(now)
                    del self.spec[k]
        return out

    def place(
        self,
        keys: Sequence[int],
        now: float,
        replica_id: int,
        speculative: bool,
        expires_at: float = float("inf"),
    ) -> int:
        """Land a copied replica of ``keys``; returns the number of blocks added.

        A speculative placement only uses free blocks and older speculative blocks within the
        slice (``spec_limit``), never normal ones (the engine needs those); if it does not fit it
        adds nothing. A demand copy (``speculative=False``) is placed like computed blocks,
        evicting unused speculative blocks first, then LRU.
        """
        missing = [k for k in keys if k not in self.blocks]
        if not missing:
            return 0
        if speculative:
            if len(missing) > self.spec_room():
                return 0
            need = max(len(missing) - self.free, len(self.spec) + len(missing) - self.spec_limit)
            if need > 0:
                self._drop_spec(need, now)
            self._account(now)
        self.replica_used[replica_id] = False
        move = self.blocks.move_to_end
        for k in reversed(keys):
            if k in self.blocks:
                move(k)
            else:
                self.blocks[k] = None
                self.owner[k] = replica_id
                if speculative:
                    self.spec[k] = expires_at
        if len(self.blocks) > self.capacity:
            self._evict(len(self.blocks) - self.capacity, now)
        return len(missing)

    def _drop_spec(self, n: int, now: float) -> list[int]:
        # Oldest speculative blocks first (dict order is placement order; a replica's leaf first).
        self._account(now)
        gone = list(self.spec)[:n]
        for k in gone:
            del self.spec[k]
            self.owner.pop(k, None)
            del self.blocks[k]
        return gone

    def expire(self, now: float) -> int:
        """Drop speculative blocks whose TTL has passed; returns how many."""
        if not self.spec:
            return 0
        gone = [k for k, t in self.spec.items() if t <= now]
        if gone:
            self._account(now)
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

    def finish(self, now: float) -> None:
        self._account(now)
