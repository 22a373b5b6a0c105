"""The ServeGen slice's earlier days as request history for the real engines' runs, as the
virtual cluster imports them (``harness/virtual/history.py``, docs/demo.md "History from day
one"): each tenant's expected requests per 10-minute window before the replayed window, at the
replay's rate (each window's count times the time scale), its arrivals drawn per demand bucket,
ending where the replay starts.

Each row names what a tap's record of that tenant would (docs/api.md, "Request history"): the
tenant (the header the taps read), the served model, and the tenant's shared prefix, as token
ids hashed with the engines' block size in the tenant's first row and as its prefix group after,
so the history lands on the workload keys the run's own records then count. Imported through the
product's ``POST /api/history-imports/``, never written into the database by hand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from controlplane.core.prefix_groups import OTHER, group_of
from harness.realvllm.traces import MAX_PROMPT, servegen_window
from harness.virtual.history import window_rows
from wire import blockhash


def servegen_history(
    *,
    tenants: int,
    duration_s: float,
    wall_rate: float,
    prefix_tokens: tuple[int, int],
    model: str,
    block_size: int,
    days: float,
    end: float,
    max_tail_tokens: int = MAX_PROMPT,
    time_scale: float = 10.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Import rows of the last ``days`` before the slice ``traces.servegen`` replays with the
    same arguments, ending at wall time ``end``."""
    w, prefixes = servegen_window(tenants, duration_s, time_scale, wall_rate, prefix_tokens, seed)
    win = float(w.history_bucket_s)
    rng = np.random.default_rng(seed)  # each stretch's arrivals (``window_rows``)
    rows: list[dict[str, Any]] = []
    for pid, tenant in enumerate(w.prefix_wkey):
        counts = w.history.get(tenant)
        ids = prefixes[pid]
        if counts is None or not len(counts) or days <= 0:
            continue
        chain = blockhash.chain_keys(ids, block_size, blockhash.extra_for(None))
        head = group_of(chain, block_size)
        group = OTHER if head is None else blockhash.to_hex(head)
        # each request's own tokens after the prefix, as ``traces.servegen`` draws them
        room = min(max_tail_tokens, MAX_PROMPT - len(ids))
        own = [
            max(1, min(int(x) // 4, room))
            for x, p in zip(w.suffix_tokens, w.pid, strict=True)
            if p == pid
        ]
        tokens = len(ids) + (sum(own) / len(own) if own else 0.0)
        whole = {"token_ids": ids, "block_size": block_size}  # as a tap's record gives it
        rows += window_rows(
            counts,
            days,
            win,
            end,
            time_scale,
            {"tenant": tenant, "model": model},
            tokens,
            whole,
            group,
            rng,
        )
    return rows
