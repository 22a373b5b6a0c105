"""bench/real_ab.py's figures: one run's from its request records and jobs (with what a prefix
miss and a hit cost, measured), which runs count, the summary per policy over the runs that
count, the paired differences with their 95% t intervals and degrees of freedom (and, where an
interval does not exclude zero, how many pairs would), and the scoreboard's holdout verdict of
each predictive run beside the bench's own pair."""

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
# A run counts only where a request that missed its prefix took at least this many times as long
# to its first token as one that found its prefix cached (medians, from the taps' records): below
# it a warm replica has little to save and no arm can differ by much.
MIN_MISS_OVER_HIT = 10.0
# ... and only where at most this share of the requests sent failed (the router's restart as the
# joining engine is added refuses a second or two of them).
MAX_FAILED_SHARE = 0.1
PREFIX_GROUP_TOKENS = 1024  # a prefix group's length (docs/api.md): every tenant prefix is longer
# The figures paired run by run (round by round).
PAIRED = (
    "ttft.mean",
    "ttft.p50",
    "ttft.p99",
    "joiner_first_2min.mean",
    "joiner_first_2min.p50",
    "hit_rate",
)
# The comparisons: (base, other), each difference other - base.
COMPARISONS = (("none", "reactive"), ("none", "predictive"), ("reactive", "predictive"))


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
    """Run-by-run differences ``other - base`` (pairs in run order; a pair with a figure
    missing, NaN, is left out): the mean, its 95% Student-t interval (``low``, ``high``, the
    half-width ``ci95``) on ``df`` = pairs - 1 degrees of freedom (None with one pair),
    ``resolved`` (the interval excludes zero) and, where it does not, ``pairs_needed``: how many
    pairs would resolve a difference this size with 80% power (``stats.pairs_needed``; None
    where nothing can be said)."""
    diffs = [o - b for b, o in zip(base, other, strict=False) if o == o and b == b]
    if not diffs:
        return {"n": 0, "mean": None, "ci95": None, "diffs": []}
    ci = stats.mean_interval(diffs)
    out: dict[str, Any] = {
        "n": len(diffs),
        "mean": statistics.fmean(diffs),
        "ci95": ci.half_width if ci else None,
        "low": ci.low if ci else None,
        "high": ci.high if ci else None,
        "df": ci.df if ci else None,
        "resolved": bool(ci and ci.excludes_zero()),
        "diffs": diffs,
    }
    if ci and not ci.excludes_zero():
        out["pairs_needed"] = stats.pairs_needed(diffs)
    return out


def prefix_costs(records: list[dict], prefix_floor: int) -> dict[str, Any]:
    """What a prefix miss and a prefix hit cost in this run, from the taps' records: a miss is
    a request served with nothing cached, a hit one served with at least ``prefix_floor``
    tokens cached (its tenant's shared prefix, whole blocks); TTFT count, median and mean of
    each, and the ratio of the medians (None without both)."""
    miss = [r["ttft_s"] for r in records if r["cached_tokens"] == 0]
    hit = [r["ttft_s"] for r in records if r["cached_tokens"] >= prefix_floor]
    m, h = summarise(miss), summarise(hit)
    ratio = m["p50"] / h["p50"] if miss and hit and h["p50"] > 0 else None
    return {"prefix_floor_tokens": prefix_floor, "miss": m, "hit": h, "miss_over_hit": ratio}


def cost_problems(run: dict, floor: float = MIN_MISS_OVER_HIT) -> list[str]:
    """Why a run cannot show what a warm prefix saves: no miss or no hit measured, or a miss
    costing less than ``floor`` times a hit."""
    costs = run.get("prefix_costs")
    if not costs:
        return ["no prefix miss/hit costs were measured"]
    m, h, ratio = costs["miss"], costs["hit"], costs["miss_over_hit"]
    if ratio is None:
        return [f"{m['n']} prefix miss(es) and {h['n']} hit(s) in the records: no ratio"]
    if ratio < floor:
        return [
            f"a prefix miss costs {1000 * m['p50']:.1f} ms and a hit {1000 * h['p50']:.1f} ms "
            f"(medians of {m['n']} and {h['n']}): {ratio:.1f}x, under the {floor:g}x a "
            "comparison of warm replicas needs"
        ]
    return []


def served_problems(run: dict, most: float = MAX_FAILED_SHARE) -> list[str]:
    """Why a run's figures are not the workload's: more than ``most`` of the requests sent
    failed (the engines or the router did not keep up: a busy machine)."""
    sent, failed = run.get("sent"), run.get("failed", 0)
    if sent is None or failed <= most * (sent + failed):
        return []
    return [f"{failed} of {sent + failed} requests failed: the engines did not keep up"]


def problems(run: dict) -> list[str]:
    """Everything that keeps a run from counting: its arm did not act (``arm_problems``), a
    miss cost too little against a hit (``cost_problems``) or most requests failed
    (``served_problems``)."""
    return arm_problems(run) + cost_problems(run) + served_problems(run)


def run_figures(
    records: list[dict],
    joiner_ref: str,
    serving_at: float | None,
    jobs: list[dict],
    prefix_floor: int = PREFIX_GROUP_TOKENS,
) -> dict[str, Any]:
    """One run's figures from the taps' request records and the control plane's jobs; a
    request with ``prefix_floor`` tokens cached found its prefix (``prefix_costs``)."""
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
        "prefix_costs": prefix_costs(records, prefix_floor),
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
    """Every run's problems (``problems``): such a run does not count, and the bench exits
    non-zero on any."""
    return [f"run {r['run']} ({r['policy']}): {p}" for r in runs for p in problems(r)]


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
    cold = [cost.prefill_s(len(r.token_ids)) for r in requests]
    hot = [cost.prefill_s(len(r.token_ids) - heads[r.tenant], heads[r.tenant]) for r in requests]
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
    """The summary over the runs that count (``problems`` empty), the paired differences round
    by round over rounds where both runs count, the runs left out and why, and each counted
    predictive run's holdout verdict beside its own pair."""
    counted = [r for r in runs if not problems(r)]
    by = {p: [r for r in counted if r["policy"] == p] for p in POLICIES}
    per_token = cold_s / max(1, prompt_tokens)
    out: dict[str, Any] = {
        "policies": {},
        "paired_vs_none": {},
        "left_out": [
            {"run": r["run"], "policy": r["policy"], "problems": problems(r)}
            for r in runs
            if problems(r)
        ],
    }
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
            "joiner_first_2min_p50_s": _mean(r["joiner_first_2min"]["p50"] for r in rs),
            "joiner_first_2min_p99_s": _mean(r["joiner_first_2min"]["p99"] for r in rs),
            "miss_ttft_p50_s": _mean(r["prefix_costs"]["miss"]["p50"] for r in rs),
            "hit_ttft_p50_s": _mean(r["prefix_costs"]["hit"]["p50"] for r in rs),
            "miss_over_hit_min": min(r["prefix_costs"]["miss_over_hit"] for r in rs),
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
    for base, other in COMPARISONS:
        pairs = _rounds(by[base], by[other])
        if not pairs:
            continue
        d = {
            k: paired([_get(a, k) for a, _ in pairs], [_get(b, k) for _, b in pairs])
            for k in PAIRED
        }
        if base == "none":
            out["paired_vs_none"][other] = d
        else:
            out["paired_predictive_vs_reactive"] = d
    out["holdout_beside_bench"] = holdout_beside_bench(
        by["none"], by["predictive"], out["paired_vs_none"].get("predictive")
    )
    return out


def _round(run: dict, runs: list[dict]) -> int:
    """The run's round (older documents: its place among its policy's runs)."""
    return run["round"] if "round" in run else runs.index(run)


def _rounds(base: list[dict], other: list[dict]) -> list[tuple[dict, dict]]:
    """(base run, other run) of every round where both counted, in round order."""
    b = {_round(r, base): r for r in base}
    o = {_round(r, other): r for r in other}
    return [(b[k], o[k]) for k in sorted(set(b) & set(o))]


def direction(low: float | None, high: float | None) -> str:
    """What an interval of a TTFT difference (treated or predictive minus its baseline) says:
    ``faster`` (it lies below zero), ``slower`` (above) or ``unresolved``."""
    if low is None or high is None:
        return "unresolved"
    return "faster" if high < 0 else "slower" if low > 0 else "unresolved"


def holdout_beside_bench(
    none: list[dict], predictive: list[dict], pair: dict | None
) -> dict[str, Any]:
    """Each counted predictive run's scoreboard holdout (read at the end of the run: the
    verdict, and its per-request TTFT difference treated minus held out with its t interval)
    beside the bench's own result: that round's predictive - none difference of the mean TTFT
    and the paired interval over every round. ``agrees`` compares directions (faster, slower,
    unresolved) of the holdout's interval and the bench's paired one; the two measure different
    things (prefixes treated or held out within one run, against whole runs without
    speculation), so a disagreement needs its reason in the note."""
    mean = (pair or {}).get("ttft.mean") or {}
    bench_dir = direction(mean.get("low"), mean.get("high"))
    base = {_round(r, none): r for r in none}
    rows = []
    for r in predictive:
        sb = r.get("scoreboard") or {}
        diff = sb.get("ttft_diff_s") or {}
        k = _round(r, predictive)
        own = r["ttft"]["mean"] - base[k]["ttft"]["mean"] if k in base else None
        ho_dir = direction(diff.get("low"), diff.get("high"))
        rows.append(
            {
                "run": r["run"],
                "round": k,
                "verdict": sb.get("verdict"),
                "firm": sb.get("firm"),
                "basis": sb.get("basis"),
                "holdout_assignments": sb.get("holdout_assignments"),
                "holdout_ttft_diff_s": diff or None,
                "holdout_direction": ho_dir,
                "bench_round_ttft_mean_diff_s": own,
                "bench_direction": bench_dir,
                "agrees": ho_dir == bench_dir,
            }
        )
    return {"bench_ttft_mean": mean or None, "bench_direction": bench_dir, "runs": rows}


def _get(run: dict, dotted: str) -> float:
    v: Any = run
    for part in dotted.split("."):
        v = v[part]
    return float(v)


_NAN = float("nan")


def _mean(xs) -> float:
    vals = [x for x in xs if x == x]  # NaN-free
    return statistics.fmean(vals) if vals else float("nan")
