"""Azure LLM inference trace CSV (``TIMESTAMP, ContextTokens, GeneratedTokens``).

The trace has arrivals and lengths but no prefix ids, so prefixes are assigned (documented, and
printed in every report): each request belongs to one of ``repos`` synthetic repositories drawn
with Zipf(1.1) popularity from a seeded generator; repository ``r`` has a shared context (its
files) of a fixed length drawn log-uniformly in [1k, 8k] tokens; a request shares
``min(its context, the repository's)`` tokens, rounded down to whole 512-token blocks, and the
rest of its context is its own. Repository prefixes get canonical keys from ``chain_keys`` over
deterministic synthetic token ids (``(r * 1_000_003 + i) % 2**31``), so a rerun yields the same
keys. The workload key is the repository.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

import numpy as np

from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload
from wire.blockhash import chain_keys


def synthetic_prefix(namespace: int, tokens: int) -> tuple[int, ...]:
    """Canonical keys of a deterministic synthetic prompt of ``tokens`` tokens."""
    ids = [(namespace * 1_000_003 + i) % 2**31 for i in range(tokens)]
    return tuple(chain_keys(ids, BLOCK_TOKENS))


def _parse_ts(text: str) -> float:
    # Seven fractional digits: more than datetime accepts, so split them off.
    main, _, frac = text.strip().partition(".")
    base = datetime.fromisoformat(main).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def load_azure(path: str | Path, seed: int = 0, repos: int = 64) -> Workload:
    path = Path(path)
    ts, ctx, gen = [], [], []
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or [h.strip() for h in header[:3]] != [
            "TIMESTAMP",
            "ContextTokens",
            "GeneratedTokens",
        ]:
            raise ValueError(f"{path}: expected header TIMESTAMP,ContextTokens,GeneratedTokens")
        for lineno, row in enumerate(reader, 2):
            try:
                ts.append(_parse_ts(row[0]))
                ctx.append(int(row[1]))
                gen.append(int(row[2]))
            except (ValueError, IndexError) as exc:
                raise ValueError(f"{path}:{lineno}: bad row ({exc})") from None
    if not ts:
        raise ValueError(f"{path}: no requests")
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, repos + 1) ** 1.1
    repo = rng.choice(repos, size=len(ts), p=weights / weights.sum())
    repo_tokens = np.exp(rng.uniform(np.log(1024), np.log(8192), size=repos)).astype(int)
    prefixes: list[tuple[int, ...]] = []
    wkeys: list[str] = []
    index: dict[tuple[int, int], int] = {}
    full_chain = [synthetic_prefix(r, int(repo_tokens[r])) for r in range(repos)]
    pid = np.empty(len(ts), dtype=np.int32)
    suffix = np.empty(len(ts), dtype=np.int32)
    for i, (r, c) in enumerate(zip(repo, ctx, strict=True)):
        blocks = min(int(repo_tokens[r]), c) // BLOCK_TOKENS
        key = (int(r), blocks)
        p = index.get(key)
        if p is None:
            p = index[key] = len(prefixes)
            prefixes.append(full_chain[r][:blocks])
            wkeys.append(f"repo{r}")
        pid[i] = p
        suffix[i] = c - blocks * BLOCK_TOKENS
    t = np.asarray(ts)
    order = np.argsort(t, kind="stable")
    w = Workload(
        "azure-code",
        t[order] - t[order][0],
        pid[order],
        suffix[order],
        np.asarray(gen, dtype=np.int32)[order],
        prefixes,
        wkeys,
    )
    w.assumptions.update(
        {
            "source": f"{path.name}: Azure LLM inference trace (arrivals and lengths only)",
            "prefix": (
                f"{repos} synthetic repositories, Zipf(1.1) popularity (seed {seed}); shared "
                "context per repository log-uniform 1k-8k tokens; a request shares "
                "min(context, repository context) in whole 512-token blocks"
            ),
            "keys": "chain_keys over deterministic synthetic token ids per repository",
        }
    )
    return w
