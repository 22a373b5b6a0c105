"""The trace's earlier days, imported as request history before the virtual cluster replays its
window (docs/demo.md, "History from day one").

The simulator's ``predictive`` forecasts each tenant from its expected requests per 10-minute
window before the replay starts (``Workload.history``). The same counts become history rows
(docs/api.md, "Request history"), placed at the trace's own pace and ending where the replay
starts. The replay runs ``time_scale`` times faster than the trace, so each window's count is
multiplied by the time scale: the rate per wall second the forecasters see in the history is the
rate the replay then posts. Within a window the arrivals are drawn, not spread: each
``SAMPLE_S`` stretch (the demo's demand bucket) gets a Poisson count at the window's rate, from
a seeded generator, one row per stretch with requests. An even spread would make every bucket of
a window equal, and the last value a perfect forecast of the next minute, which no real
history gives it. Each row names the tenant's prefix group (the first also its whole prefix
chain), so the history lands on the workload keys the replay's records make.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
import numpy as np

from controlplane.core.prefix_groups import group_of
from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload
from harness.launch import SETTINGS
from wire.blockhash import to_hex

log = logging.getLogger(__name__)
DAY_S = 86400.0
# The stretch each drawn count stands for: the demand bucket the demo's control plane keeps.
SAMPLE_S = float(SETTINGS["PREWARM_DEMAND_BUCKET_SECONDS"])


def history_rows(
    wl: Workload,
    model: str,
    time_scale: float,
    days: float,
    end: float,
    seed: int = 0,
    sample_s: float = SAMPLE_S,
) -> list[dict[str, Any]]:
    """The last ``days`` of each tenant's history before the replay of ``wl`` at ``time_scale``,
    ending at wall time ``end``, as import rows of ``model`` (arrivals drawn with ``seed`` per
    ``sample_s``)."""
    w = float(wl.history_bucket_s)
    scale = time_scale
    suffix = float(wl.suffix_tokens.mean()) if len(wl) else 0.0
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for pid, tenant in enumerate(wl.prefix_wkey):
        counts = wl.history.get(tenant)
        prefix = wl.prefixes[pid]
        if counts is None or not len(counts) or not prefix:
            continue
        head = group_of(prefix, BLOCK_TOKENS)
        group = to_hex(head) if head is not None else "*"
        tokens = len(prefix) * BLOCK_TOKENS + suffix
        whole = {"keys": [to_hex(x) for x in prefix], "block_size": BLOCK_TOKENS}
        key = {"tenant": tenant, "model": model}
        rows += window_rows(counts, days, w, end, scale, key, tokens, whole, group, rng, sample_s)
    return rows


def window_rows(
    counts: Any,
    days: float,
    window_s: float,
    end: float,
    scale: float,
    key: dict[str, str],
    tokens_per_request: float,
    whole: dict[str, Any],
    group: str,
    rng: np.random.Generator,
    sample_s: float = SAMPLE_S,
) -> list[dict[str, Any]]:
    """One tenant's rows: its expected requests per window of the last ``days`` (``counts``,
    the last ending at wall time ``end``) times ``scale``, drawn as Poisson counts per
    ``sample_s`` stretch of the window (``rng``), one row per stretch with requests; ``key``
    names the tenant and model, the first row carries the ``whole`` prefix (the key's shared
    chain from the start) and the rest its prefix ``group``."""
    n = min(len(counts), int(round(days * DAY_S / window_s)))
    per_window = max(1, int(round(window_s / sample_s)))
    step = window_s / per_window
    rows: list[dict[str, Any]] = []
    for k, c in enumerate(counts[len(counts) - n :]):
        mean = float(c) * scale
        if mean <= 0:
            continue
        drawn = rng.poisson(mean / per_window, size=per_window)
        t0 = end - (n - k) * window_s
        for j in np.flatnonzero(drawn).tolist():
            requests = int(drawn[j])
            row: dict[str, Any] = {
                "time": round(t0 + j * step, 3),
                "seconds": step,
                **key,
                "requests": requests,
                "prompt_tokens": int(round(requests * tokens_per_request)),
            }
            row.update(whole if not rows else {"prefix_group": group})
            rows.append(row)
    return rows


def import_trace_history(
    wl: Workload, model: str, url: str, token: str, time_scale: float, days: float, seed: int = 0
) -> dict:
    """Post the history ending now to ``url``'s ``POST /api/history-imports/`` (an operator's
    ``token``; arrivals drawn with ``seed``); the import's summary, with how long the post took
    (``post_seconds``)."""
    rows = history_rows(wl, model, time_scale, days, time.time(), seed)
    summary = post_history(url, token, rows, "virtual-cluster")
    log.info(
        "imported %.1f days of the trace's history: %d requests in %d rows, %d buckets, %.1f s",
        days,
        summary["requests"],
        summary["rows"],
        summary["buckets_created"],
        summary["post_seconds"],
    )
    return summary


def post_history(url: str, token: str, rows: list[dict[str, Any]], source: str) -> dict:
    """Import ``rows`` as one JSONL file through ``url``'s ``POST /api/history-imports/`` (the
    product's import, all or nothing); its summary with ``post_seconds`` and ``bytes``."""
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    t0 = time.perf_counter()
    resp = httpx.post(
        url + "/api/history-imports/",
        headers={"Authorization": f"Bearer {token}"},
        files={"file": ("trace-history.jsonl", body, "application/x-ndjson")},
        data={"format": "jsonl", "source": source},
        timeout=600.0,
    )
    if resp.status_code not in (200, 201):
        raise RuntimeError(f"history import refused: {resp.status_code} {resp.text[:300]}")
    summary = resp.json()
    summary["post_seconds"] = round(time.perf_counter() - t0, 2)
    summary["bytes"] = len(body)
    return summary
