"""bench/real_ab.py's figures: one run's from its request records and jobs, the summary per
policy, and the paired differences with their 95% intervals."""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

from _common import percentile

from controlplane.core import stats
from harness.realvllm.driver import TraceRequest
from wire.protocol import (
    JOB_CONFIRMED,
    JOB_LOST,
    JOB_PARTIAL,
    ROLE_TARGET,
    TRANSPORT_WARMUP,
)

POLICIES = ("none", "reactive", "predictive")
# The strategy each arm's policy runs (its plans name it).
STRATEGY = {"none": "off", "reactive": "reactive", "predictive": "predictive"}
# A warm-up landed when the target engine's own KV events showed it (confirmed; lost: shown,
# then evicted before its hold ended; partial: part of the prefix shown).
LANDED = (JOB_CONFIRMED, JOB_LOST, JOB_PARTIAL)
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
        "warmups_landed": sum(1 for j in warm if j["state"] in LANDED),
        "warmups_by_state": count_by(j["state"] for j in warm),
        "warmup_prompt_tokens": warm_tokens,
        "warmup_tokens_computed": warm_tokens - warm_cached,
    }


def plan_figures(plans: list[dict]) -> dict[str, Any]:
    """What the control plane's plan cycle and ingest did in a run: plans stored, the strategies
    and triggers they name, items planned, and the most items one plan left waiting for their
    prefixes' token ids."""
    sm = [p.get("summary") or {} for p in plans]
    return {
        "plans": len(plans),
        "strategies": sorted({str(x.get("strategy")) for x in sm if x.get("strategy")}),
        "by_trigger": count_by(str(x.get("trigger") or "cycle") for x in sm),
        "items": sum(int(x.get("items") or 0) for x in sm),
        "max_waiting_for_token_ids": max(
            (int(x.get("waiting_for_token_ids") or 0) for x in sm), default=0
        ),
    }


def timelines(plans: list[dict], jobs: list[dict], started: float) -> dict[str, list]:
    """When, from the run's start, each plan was stored (trigger, items, items waiting for token
    ids) and each warm-up was created (its state, its target's engine id)."""

    def at(row: dict) -> float:
        return round(datetime.fromisoformat(row["created_at"]).timestamp() - started, 1)

    return {
        "plans": sorted(
            (
                at(p),
                (p.get("summary") or {}).get("trigger", "cycle"),
                int((p.get("summary") or {}).get("items") or 0),
                int((p.get("summary") or {}).get("waiting_for_token_ids") or 0),
            )
            for p in plans
        ),
        "warmups": sorted(
            (at(j), j["state"], str(j.get("target")))
            for j in jobs
            if j["transport"] == TRANSPORT_WARMUP
        ),
    }


def arm_problems(run: dict) -> list[str]:
    """Why a run's arm did not do what it names (empty: it did). ``none`` sends no warm-up and
    plans nothing; ``reactive`` and ``predictive`` plan under their own strategy (every plan
    names it); ``predictive`` sends warm-ups and at least one lands, shown by the target
    engine's KV events; an arm that sends warm-ups has at least one land. ``reactive`` may
    send none: a trace without a hot spot gives it nothing to copy (``arm_notes`` says so)."""
    pol, out = run["policy"], []
    sent, landed = run["warmups"], run["warmups_landed"]
    plans = run.get("plan_figures") or {"plans": 0, "strategies": []}
    if pol == "none":
        if sent:
            out.append(f"none sent {sent} warm-up(s): its strategy is off")
        if plans["plans"]:
            out.append(f"none stored {plans['plans']} plan(s): its strategy is off")
        return out
    if not plans["plans"]:
        out.append(f"{pol} stored no plan: its policy was never evaluated")
    elif plans["strategies"] != [STRATEGY[pol]]:
        out.append(f"{pol}'s plans name the strategies {plans['strategies']}")
    if pol == "predictive" and not sent:
        waiting = plans.get("max_waiting_for_token_ids", 0)
        why = f" ({waiting} item(s) waited for their prefixes' token ids)" if waiting else ""
        out.append(f"predictive sent no warm-up{why}")
    if sent and not landed:
        out.append(
            f"{pol} sent {sent} warm-up(s) and none landed "
            f"(by state: {run.get('warmups_by_state')})"
        )
    return out


def failures(runs: list[dict]) -> list[str]:
    """Every arm's problems, run by run (``arm_problems``): the bench exits non-zero on any."""
    return [f"run {r['run']} ({r['policy']}): {p}" for r in runs for p in arm_problems(r)]


def arm_notes(run: dict) -> list[str]:
    """What the table says beside an arm that did its job but had nothing to do."""
    if run["policy"] == "reactive" and not run["warmups"]:
        waiting = (run.get("plan_figures") or {}).get("max_waiting_for_token_ids", 0)
        if waiting:
            return [
                f"reactive planned up to {waiting} warm-up(s) that waited for their prefixes' "
                "token ids; none went"
            ]
        return ["reactive found no hot spot (it evaluated and copied nothing)"]
    return []


def count_by(items) -> dict[str, int]:
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
            "warmups_landed": statistics.fmean(r.get("warmups_landed", 0) for r in rs),
            "client_ttft_mean_s": _mean(r.get("client_ttft", {}).get("mean", _NAN) for r in rs),
            "client_ttft_p99_s": _mean(r.get("client_ttft", {}).get("p99", _NAN) for r in rs),
            "failed_requests": statistics.fmean(r.get("failed", 0) for r in rs),
            "notes": sorted({n for r in rs for n in arm_notes(r)}),
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


_NAN = float("nan")


def _mean(xs) -> float:
    vals = [x for x in xs if x == x]  # NaN-free
    return statistics.fmean(vals) if vals else float("nan")
