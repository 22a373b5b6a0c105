"""A virtual engine: a simulator engine whose KV cache is seen by a real agent.

Every change to the simulated cache (blocks computed by a request, blocks evicted, replicas that
arrived by copy) is published as vLLM KV events on the engine's ZMQ sockets, and mirrored into
the agent's file block store (``transfer.block_store = "files"``): each resident block is a file
of deterministic bytes (``block_payload``), so a copy the control plane orders moves real bytes
from the source agent's store to the target's. A block file that appears in the store without
the engine having written it arrived by copy: the engine checks its bytes and gains the block.

Payloads are scaled down (``payload_bytes`` per block, e.g. 64 KiB for a 160 MiB block of a 70B
model) so that a laptop can move them; the agent reports the real ``bytes_per_block`` so the
control plane plans with real sizes.
"""

from __future__ import annotations

import logging
import os
from hashlib import blake2b
from pathlib import Path

from controlplane.sim.engine import Engine
from harness.virtual.publisher import KvEventPublisher, block_removed, block_stored
from harness.virtual.tokens import TokenBook
from wire.blockhash import ROOT_PARENT

log = logging.getLogger(__name__)
_MASK = (1 << 64) - 1


def block_payload(key: int, size: int) -> bytes:
    """The bytes a virtual engine holds for block ``key`` (same everywhere, so copies verify)."""
    seed = blake2b(key.to_bytes(8, "little"), digest_size=64, person=b"prewarm-vblk").digest()
    return (seed * (size // 64 + 1))[:size]


def block_file(store: Path, key: int) -> Path:
    # The naming of nodeagent.blockstore.FileBlockStore (the agent reads these files).
    return store / f"{key:016x}.blk"


class VirtualEngine:
    """One simulator ``Engine`` published as a vLLM engine to one agent."""

    def __init__(
        self,
        sim_engine: Engine,
        engine_id: str,
        model: str,
        book: TokenBook,
        store_dir: Path,
        payload_bytes: int,
        publisher: KvEventPublisher,
    ):
        self.sim = sim_engine
        self.engine_id = engine_id
        self.model = model
        self.book = book
        self.store = store_dir
        self.store.mkdir(parents=True, exist_ok=True)
        for stale in self.store.glob("*.blk"):
            stale.unlink()  # a new run starts empty, as an engine does after a restart
        self.payload_bytes = payload_bytes
        self.publisher = publisher
        # vLLM's block hashes are seeded per process: model that with a per-engine salt.
        self._salt = blake2b(engine_id.encode(), digest_size=8).digest()
        self.written: set[int] = set()  # block files this engine wrote or accepted
        self.copied_in = 0  # blocks gained by copy
        self.copy_bytes_in = 0
        self.bad_copies = 0

    def engine_hash(self, key: int) -> int:
        h = blake2b(key.to_bytes(8, "little"), digest_size=8, key=self._salt)
        return int.from_bytes(h.digest(), "big") & (_MASK >> 1)

    # -- publishing cache changes -----------------------------------------------------------
    def publish_changes(self, before: set[int], order: list[int] | tuple[int, ...]) -> None:
        """Publish what changed since ``before`` (the cache's key set earlier). ``order`` lists
        keys in chain order (root first), so stored runs are published parent before child."""
        after = self.sim.cache.blocks
        removed = [k for k in before if k not in after]
        stored = [k for k in order if k in after and k not in before]
        events = []
        if removed:
            events.append(block_removed([self.engine_hash(k) for k in removed]))
            for k in removed:
                self._unlink(k)
        for run in _runs(stored, self.book):
            parent = self.book.parent_of(run[0])
            tokens: list[int] = []
            for k in run:
                tokens += self.book.tokens_of(k)
            events.append(
                block_stored(
                    [self.engine_hash(k) for k in run],
                    None if parent == ROOT_PARENT else self.engine_hash(parent),
                    tokens,
                    self.book.block_tokens,
                )
            )
            for k in run:
                self._write(k)
        if events:
            self.publisher.publish(events)

    def _write(self, key: int) -> None:
        path = block_file(self.store, key)
        if key not in self.written:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(block_payload(key, self.payload_bytes))
            os.replace(tmp, path)
            self.written.add(key)

    def _unlink(self, key: int) -> None:
        self.written.discard(key)
        block_file(self.store, key).unlink(missing_ok=True)

    # -- copies arriving through the agent --------------------------------------------------
    def scan_store(self) -> tuple[list[int], list[int]]:
        """Block files that appeared (copied in by the agent) and written ones that vanished
        (deleted by an evict job). Returns (arrived keys that verified, vanished keys)."""
        present = {int(p.stem, 16) for p in self.store.glob("*.blk")}
        arrived = []
        for k in present - self.written:
            try:
                data = block_file(self.store, k).read_bytes()
            except FileNotFoundError:
                continue
            if k in self.book.origin and data == block_payload(k, len(data)) and data:
                arrived.append(k)
                self.copy_bytes_in += len(data)
            else:
                self.bad_copies += 1
                log.warning(
                    "%s: block %016x in the store is not a block of this workload",
                    self.engine_id,
                    k,
                )
            self.written.add(k)
        vanished = [k for k in self.written if k not in present]
        return arrived, vanished


def _runs(keys: list[int], book: TokenBook) -> list[list[int]]:
    """Split keys (chain order) into runs where each key's parent is the previous key."""
    runs: list[list[int]] = []
    for k in keys:
        if k not in book.origin:
            continue
        if runs and book.parent_of(k) == runs[-1][-1]:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs
