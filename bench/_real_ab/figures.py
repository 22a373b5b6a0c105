"""bench/real_ab.py's figures: one run's from its request records and jobs, the summary per
policy, and the paired differences with their 95% intervals."""

from __future__ import annotations

import statistics
from typing import Any

from _common import percentile

from controlplane.core import stats
from controlplane.core.protocol import ROLE_TARGET, TRANSPORT_WARMUP
from controlplane.harness.realvllm.driver import TraceRequest

POLICIES = ("none", "reactive", "predictive")
JOINER_WINDOW_S = 120.0  # the joining engine's first two minutes of serving


# -- statistics ------------------------------------------------------------------------------
def summarise(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
    }


def paired(base: list[float], other: list[float]) -> dict[str, Any]:
    """Run-by-run differences ``other - base`` (pairs in run order): mean and the half-width
    of its 95% Student-t interval (None with one pair)."""
    diffs = [o - b for b, o in zip(base, other, strict=False)]
    if not diffs:
        return {"n": 0, "mean": None, "ci95": None, "diffs": []}
    ci = stats.paired(other, base) if len(diffs) > 1 else None
    half = ci.half_width if ci else None
    return {"n": len(diffs), "mean": statistics.fmean(diffs), "ci95": half, "diffs": diffs}


def run_figures(
    records: list[dict], joiner_ref: str, serving_at: float | None, jobs: list[dict]
) -> dict[str, Any]:
    """One run's figures from the driver's request records and the control plane's jobs."""
    ttft = [r["ttft_s"] for r in records]
    first = (
        [
            r["ttft_s"]
            for r in records
            if r["engine"] == joiner_ref and serving_at <= r["time"] < serving_at + JOINER_WINDOW_S
        ]
        if serving_at is not None
        else []
    )
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    warm = [j for j in jobs if j["transport"] == TRANSPORT_WARMUP]
    tgt = [((j.get("results") or {}).get(ROLE_TARGET) or {}) for j in warm]
    warm_tokens = sum(int(t.get("prompt_tokens") or 0) for t in tgt)
    warm_cached = sum(int(t.get("cached_tokens") or 0) for t in tgt)
    return {
        "requests": len(records),
        "ttft": summarise(ttft),
        "joiner_first_2min": summarise(first),
        "joiner_requests": sum(1 for r in records if r["engine"] == joiner_ref),
        "hit_rate": sum(1 for r in records if r["cached_tokens"] > 0) / max(1, len(records)),
        "cached_token_share": cached / max(1, prompt),
        "warmups": len(warm),
        "warmups_by_state": _count(j["state"] for j in warm),
        "warmup_prompt_tokens": warm_tokens,
        "warmup_tokens_computed": warm_tokens - warm_cached,
    }


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def gpu_ratio(requests: list[TraceRequest], model: str = "llama3-70b", gpu: str = "h100") -> dict:
    """The same prompts priced by the simulator's cost model on GPUs: prefill of the whole
    prompt against prefill of its own part after the cached tenant prefix (means)."""
    from controlplane.core.costmodel import CostModel

    cost = CostModel.preset(model, gpu)
    heads: dict[str, int] = {}
    for r in requests:  # a tenant's shared prefix: what all its prompts start with
        prev = heads.get(r.tenant)
        if prev is None:
            heads[r.tenant] = len(r.token_ids)
            continue
        first = next(x for x in requests if x.tenant == r.tenant)
        n = 0
        while n < min(prev, len(r.token_ids)) and first.token_ids[n] == r.token_ids[n]:
            n += 1
        heads[r.tenant] = n
    cold = [cost.prefill_seconds(len(r.token_ids)) for r in requests]
    hot = [
        cost.prefill_seconds(len(r.token_ids) - heads[r.tenant], heads[r.tenant]) for r in requests
    ]
    return {
        "model": model,
        "gpu": f"{cost.gpus} x {gpu}",
        "cold_prefill_s": statistics.fmean(cold),
        "cached_prefill_s": statistics.fmean(hot),
        "ratio": statistics.fmean(cold) / statistics.fmean(hot),
        "mean_prompt_tokens": statistics.fmean(len(r.token_ids) for r in requests),
        "mean_prefix_tokens": statistics.fmean(heads[r.tenant] for r in requests),
    }


# -- report ----------------------------------------------------------------------------------
def report(runs: list[dict], cold_s: float, prompt_tokens: int) -> dict:
    by = {p: [r for r in runs if r["policy"] == p] for p in POLICIES}
    per_token = cold_s / max(1, prompt_tokens)
    out: dict[str, Any] = {"policies": {}, "paired_vs_none": {}}
    for p, rs in by.items():
        if not rs:
            continue
        pooled = [t for r in rs for (_, t, _) in r["timeline"]]
        out["policies"][p] = {
            "runs": len(rs),
            "ttft_mean_s": statistics.fmean(r["ttft"]["mean"] for r in rs),
            "ttft_p50_s": statistics.fmean(r["ttft"]["p50"] for r in rs),
            "ttft_p99_s": statistics.fmean(r["ttft"]["p99"] for r in rs),
            "ttft_pooled": summarise(pooled),
            "joiner_first_2min_mean_s": _mean(r["joiner_first_2min"]["mean"] for r in rs),
            "joiner_first_2min_p99_s": _mean(r["joiner_first_2min"]["p99"] for r in rs),
            "hit_rate": statistics.fmean(r["hit_rate"] for r in rs),
            "cached_token_share": statistics.fmean(r["cached_token_share"] for r in rs),
            "warmups": statistics.fmean(r["warmups"] for r in rs),
            "warmup_tokens_computed": statistics.fmean(r["warmup_tokens_computed"] for r in rs),
            "warmup_cost_s": statistics.fmean(r["warmup_tokens_computed"] for r in rs) * per_token,
        }
    base = by["none"]
    for p in ("reactive", "predictive"):
        if not by[p] or not base:
            continue
        out["paired_vs_none"][p] = {
            k: paired([_get(r, k) for r in base], [_get(r, k) for r in by[p]])
            for k in ("ttft.mean", "ttft.p50", "ttft.p99", "joiner_first_2min.mean", "hit_rate")
        }
    if by["reactive"] and by["predictive"]:
        out["paired_predictive_vs_reactive"] = {
            k: paired([_get(r, k) for r in by["reactive"]], [_get(r, k) for r in by["predictive"]])
            for k in ("ttft.mean", "ttft.p99", "joiner_first_2min.mean")
        }
    return out


def _get(run: dict, dotted: str) -> float:
    v: Any = run
    for part in dotted.split("."):
        v = v[part]
    return float(v)


def _mean(xs) -> float:
    vals = [x for x in xs if x == x]  # NaN-free
    return statistics.fmean(vals) if vals else float("nan")
