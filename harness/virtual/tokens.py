"""Token ids behind the simulator's canonical keys, so virtual engines can publish them.

vLLM's ``BlockStored`` carries each block's token ids; the agent derives canonical keys from them
(``wire.blockhash``). The simulator's bundled workloads build their shared prefixes
from deterministic synthetic token ids (``workloads.azure.synthetic_prefix``: namespace ``ns``,
token ``i`` = ``(ns * 1_000_003 + i) % 2**31``), so the ids of any prefix block can be rebuilt.
A request's own blocks (after its prefix) get ids from a namespace of their own, per request.
Every rebuilt chain is checked against the workload's keys: a workload whose prefixes were not
built this way (Mooncake's hash ids) is refused with a clear error.
"""

from __future__ import annotations

from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload
from wire.blockhash import ROOT_PARENT, block_key, chain_keys

_MOD = 2**31
_MUL = 1_000_003
OWN_NAMESPACE_BASE = 1 << 22  # request i's own blocks use namespace OWN_NAMESPACE_BASE + i


def namespace_tokens(ns: int, start: int, count: int) -> list[int]:
    base = ns * _MUL
    return [(base + i) % _MOD for i in range(start, start + count)]


class TokenBook:
    """Where each canonical key of a workload comes from: token ids and chain position."""

    def __init__(self, workload: Workload, block_tokens: int = BLOCK_TOKENS):
        self.block_tokens = block_tokens
        self.namespace: list[int] = []
        # key -> (namespace, block index, parent key)
        self.origin: dict[int, tuple[int, int, int]] = {}
        for pid, chain in enumerate(workload.prefixes):
            ns = self._find_namespace(workload, pid, chain)
            self.namespace.append(ns)
            parent = ROOT_PARENT
            for b, k in enumerate(chain):
                self.origin.setdefault(k, (ns, b, parent))
                parent = k

    def _find_namespace(self, wl: Workload, pid: int, chain: tuple[int, ...]) -> int:
        if not chain:
            return -1
        wkey = wl.prefix_wkey[pid]
        guesses = []
        if wkey.startswith("repo") and wkey[4:].isdigit():
            guesses.append(int(wkey[4:]))  # azure: namespace = repository index
        names = list(dict.fromkeys(wl.prefix_wkey))
        if wkey in names:
            guesses.append(10_000 + names.index(wkey))  # servegen: 10_000 + tenant index
        for ns in guesses:
            if (
                chain_keys(namespace_tokens(ns, 0, self.block_tokens), self.block_tokens)[0]
                == chain[0]
            ):
                return ns
        raise ValueError(
            f"workload {wl.name!r}: prefix {wkey!r} is not built from synthetic token ids, so a "
            "virtual engine cannot publish its tokens (use servegen or azure-code)"
        )

    def tokens_of(self, key: int) -> list[int]:
        ns, b, _ = self.origin[key]
        return namespace_tokens(ns, b * self.block_tokens, self.block_tokens)

    def parent_of(self, key: int) -> int:
        return self.origin[key][2]

    def own_blocks(self, request: int, parent: int, tokens: int) -> list[int]:
        """Keys of request ``request``'s own full blocks after ``parent``; recorded in the book."""
        ns = OWN_NAMESPACE_BASE + request
        keys = []
        for b in range(tokens // self.block_tokens):
            ids = namespace_tokens(ns, b * self.block_tokens, self.block_tokens)
            k = block_key(parent, ids)
            self.origin[k] = (ns, b, parent)
            keys.append(k)
            parent = k
        return keys

    def forget(self, keys: list[int]) -> None:
        """Drop own blocks nobody holds any more (bounded memory over long runs)."""
        for k in keys:
            o = self.origin.get(k)
            if o is not None and o[0] >= OWN_NAMESPACE_BASE:
                del self.origin[k]
