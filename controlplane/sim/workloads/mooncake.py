"""Mooncake JSONL (kvcache-ai/Mooncake FAST25 traces): hash_ids used as canonical block keys.

Each line: ``timestamp`` (ms), ``input_length``, ``output_length`` (tokens), ``hash_ids`` (one id
per 512-token block, chained: equal ids = identical prefix content). The ids are used directly as
canonical keys of 512-token blocks. The prompt's full blocks form its
prefix chain; the tail of a partial last block is never cached and counts as its own suffix.
The workload key of a request is its chain's first two blocks (block 0 is shared by every
request, so the second block tells conversations / documents apart).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload


def load_mooncake(path: str | Path) -> Workload:
    path = Path(path)
    t, pid, suffix, out = [], [], [], []
    index: dict[tuple[int, ...], int] = {}
    prefixes: list[tuple[int, ...]] = []
    wkeys: list[str] = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ts = float(row["timestamp"]) / 1000.0
                n_in = int(row["input_length"])
                n_out = int(row["output_length"])
                ids = [int(h) for h in row["hash_ids"]]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Mooncake trace row ({exc})") from None
            if n_in < 0 or n_out < 0 or any(h < 0 for h in ids):
                raise ValueError(f"{path}:{lineno}: negative length or hash id")
            full = min(len(ids), n_in // BLOCK_TOKENS)
            chain = tuple(ids[:full])
            p = index.get(chain)
            if p is None:
                p = index[chain] = len(prefixes)
                prefixes.append(chain)
                wkeys.append("mc:" + "-".join(map(str, chain[:2])))
            t.append(ts)
            pid.append(p)
            suffix.append(n_in - full * BLOCK_TOKENS)
            out.append(n_out)
    if not t:
        raise ValueError(f"{path}: no requests")
    order = np.argsort(np.asarray(t), kind="stable")
    tt = np.asarray(t, dtype=np.float64)[order]
    w = Workload(
        "mooncake",
        tt - tt[0],
        np.asarray(pid, dtype=np.int32)[order],
        np.asarray(suffix, dtype=np.int32)[order],
        np.asarray(out, dtype=np.int32)[order],
        prefixes,
        wkeys,
    )
    w.assumptions.update(
        {
            "source": f"{path.name}: Mooncake JSONL, timestamps in ms",
            "prefix": "hash_ids used directly as canonical keys of 512-token blocks",
            "workload_key": "first two hash ids of the chain",
        }
    )
    return w
