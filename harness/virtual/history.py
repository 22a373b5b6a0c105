"""The trace's earlier days, imported as request history before the virtual cluster replays its
window (docs/demo.md, "History from day one").

The simulator's ``predictive`` forecasts each tenant from its expected requests per 10-minute
window before the replay starts (``Workload.history``). The same counts become history rows
(docs/api.md, "Request history"): one row per tenant and window, its requests spread over the
window, placed at the trace's own pace and ending where the replay starts. The replay runs
``time_scale`` times faster than the trace, so each window's count is multiplied by the time
scale: the rate per wall second the forecasters see in the history is the rate the replay then
posts. Each row names the tenant's prefix group (the first also its whole prefix chain), so the
history lands on the workload keys the replay's records make.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx

from controlplane.core.prefix_groups import group_of
from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload
from wire.blockhash import to_hex

log = logging.getLogger(__name__)
DAY_S = 86400.0


def history_rows(
    wl: Workload, model: str, time_scale: float, days: float, end: float
) -> list[dict[str, Any]]:
    """The last ``days`` of each tenant's history before the replay of ``wl`` at ``time_scale``,
    ending at wall time ``end``, as import rows of ``model``."""
    w = float(wl.history_bucket_s)
    scale = time_scale
    suffix = float(wl.suffix_tokens.mean()) if len(wl) else 0.0
    rows: list[dict[str, Any]] = []
    for pid, tenant in enumerate(wl.prefix_wkey):
        counts = wl.history.get(tenant)
        prefix = wl.prefixes[pid]
        if counts is None or not len(counts) or not prefix:
            continue
        head = group_of(prefix, BLOCK_TOKENS)
        group = to_hex(head) if head is not None else "*"
        tokens = len(prefix) * BLOCK_TOKENS + suffix
        n = min(len(counts), int(round(days * DAY_S / w)))
        first = True
        for k, c in enumerate(counts[len(counts) - n :]):
            requests = int(round(float(c) * scale))
            if requests <= 0:
                continue
            row: dict[str, Any] = {
                "time": round(end - (n - k) * w, 3),
                "seconds": w,
                "tenant": tenant,
                "model": model,
                "requests": requests,
                "prompt_tokens": int(round(requests * tokens)),
            }
            if first:  # the whole chain once: the key's shared prefix from the start
                row["keys"], row["block_size"] = [to_hex(x) for x in prefix], BLOCK_TOKENS
                first = False
            else:
                row["prefix_group"] = group
            rows.append(row)
    return rows


def import_trace_history(
    wl: Workload, model: str, url: str, token: str, time_scale: float, days: float
) -> dict:
    """Post the history ending now to ``url``'s ``POST /api/history-imports/`` (an operator's
    ``token``); the import's summary, with how long the post took (``post_seconds``)."""
    end = time.time()
    rows = history_rows(wl, model, time_scale, days, end)
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    t0 = time.perf_counter()
    resp = httpx.post(
        url + "/api/history-imports/",
        headers={"Authorization": f"Bearer {token}"},
        files={"file": ("trace-history.jsonl", body, "application/x-ndjson")},
        data={"format": "jsonl", "source": "virtual-cluster"},
        timeout=600.0,
    )
    if resp.status_code not in (200, 201):
        raise RuntimeError(f"history import refused: {resp.status_code} {resp.text[:300]}")
    summary = resp.json()
    summary["post_seconds"] = round(time.perf_counter() - t0, 2)
    summary["bytes"] = len(body)
    log.info(
        "imported %.1f days of the trace's history: %d requests in %d rows, %d buckets, %.1f s",
        days,
        summary["requests"],
        summary["rows"],
        summary["buckets_created"],
        summary["post_seconds"],
    )
    return summary
