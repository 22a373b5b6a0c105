"""``prewarm-sim seeds``: predictive vs reactive vs the ceiling over seeds, with the noise per cell.

A *cell* is one (model, scenario, load, prefix lengths, link) setting. Each seed draws a new
ServeGen workload (arrival times from the windows' fitted processes, tenant prefix lengths), and
every policy runs on the same draw, so the comparison is paired: per seed, the gain of a policy
over ``reactive`` is ``(reactive - policy) / reactive`` of mean or p99 TTFT. A cell reports the
mean gain over seeds and its noise, the half-width of a 95% confidence interval of that mean
(Student t over the per-seed gains); a gain is *beyond noise* when ``|mean| > noise``. The
same statistics serve the sweep's map (``controlplane/sim/sweep.py``).

TTFT figures leave out each run's first ``warmup`` seconds (default 300: the cold start).
A seed is *saturated*, and left out, only where the ceiling itself cannot serve it: ``everywhere``
(every prefix free on every engine) has a p99 TTFT above ``CEILING_P99_LIMIT_S``, so the fleet's
queues, not any placement, set its TTFT. One policy's backlog (``backlog_end_s``, kept in each
run) never leaves a seed out: near overload is where a policy's placements can tip a fleet into
a spiral, which is what the comparison must see. A run without ``everywhere`` leaves no seed out.
Saturated seeds are listed per cell with the reason (``saturated_seeds``, ``left_out``); the
headline gains are over the other seeds (``gains_over``, ``seeds_measured``) while at least two
remain, and the gains over all seeds are kept beside them (``*_all_seeds``).
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from controlplane.core import stats
from controlplane.sim.runner import run_policies
from controlplane.sim.scenarios import build


def t95(df: int) -> float:
    """Two-sided 95% Student t quantile (``core.stats``)."""
    return stats.t_quantile(df)


TRACE_SPAN_S = {"mooncake": 3537.0, "azure-code": 3436.0}  # the bundled traces' lengths
KEY_CELLS = (
    ("llama3-70b", "steady"),
    ("llama3-70b", "scaleout"),
    ("llama3-70b", "slowlink"),
    ("llama3-70b", "tiered"),
    ("llama3-8b", "steady"),
    ("llama3-8b", "slowlink"),
)
# ``everywhere`` (every prefix free on every engine, without copies or their traffic) is the
# ceiling a placement policy is measured against; ``clairvoyant`` (the planner fed the true
# arrivals) is a reference policy, not a bound.
CEILING = "everywhere"
COMPARED = ("reactive", "predictive", CEILING)
# The baselines beside ``reactive`` (the strategy Prewarm ships): the routing-time rule and
# Mooncake's hot fanout; predictive's gains over each are reported too.
BASELINES = ("routing-reactive", "hot-fanout")


def gain_stats(base: list[float], other: list[float]) -> dict:
    """Paired relative gains of ``other`` over ``base`` (lower is better): mean, 95% CI
    half-width (``noise``, Student t over the per-seed gains), per-seed values, and whether the
    mean is beyond the noise."""
    if len(base) != len(other) or not base:
        raise ValueError("need the same, non-zero number of runs on both sides")
    gains = [(b - o) / b if b > 0 else 0.0 for b, o in zip(base, other, strict=True)]
    ci = stats.mean_interval(gains)
    noise = None if ci is None else ci.half_width  # one seed: no noise estimate
    return {
        "mean": sum(gains) / len(gains),
        "noise": noise,
        "per_seed": gains,
        "beyond_noise": noise is not None and abs(sum(gains) / len(gains)) > noise,
    }


# Traces with one fixed arrival sequence (Mooncake conversation, Azure code): a seed picks the
# window start (seed x WINDOW_STEP_S into the trace, wrapping) and, for Azure, the draw of the
# synthetic repository prefixes; their load is the trace's own.
WINDOW_STEP_S = 230.0
TRACE_WORKLOADS = ("mooncake", "azure-code")


def run_one(job: dict) -> dict:
    """One seed of one cell: every policy's summary (picklable, for worker processes)."""
    setup = setup_of(job)
    warmup_s = job.get("warmup", 0.0)  # not-vocabulary: seconds before measuring
    doc, _ = run_policies(setup, job["policies"], seed=job["seed"], warmup_s=warmup_s)
    return {**job, "policies": doc["policies"], "offered_load": doc["offered_load"]}


def setup_of(job: dict):
    """The cluster and workload of one seed of one cell (``run_one``'s)."""
    workload = job.get("workload", "servegen")
    start = None
    if workload in TRACE_WORKLOADS:
        span = TRACE_SPAN_S[workload] - (job.get("duration") or 1200.0)
        start = (job["seed"] * WINDOW_STEP_S) % max(span, WINDOW_STEP_S)
    setup = build(
        workload=None if job.get("trace_dir") else workload,
        trace_dir=job.get("trace_dir"),
        start=start,
        scenario=job["scenario"],
        model=job["model"],
        gpu=job.get("gpu", "h100"),
        gpus_per_engine=job.get("gpus_per_engine"),
        engines=job.get("engines", 16),
        tenants=job.get("tenants", 30),
        duration=job.get("duration"),
        load=job.get("load", 0.55),
        prefix_tokens=job.get("prefix_tokens"),
        seed=job["seed"],
        clients=job.get("clients", "all"),
    )
    if job.get("link_bytes_per_s"):
        setup.config.network_bytes_per_s = job["link_bytes_per_s"]
    return setup


def run_jobs(jobs: list[dict], workers: int = 1) -> list[dict]:
    if workers <= 1:
        return [run_one(j) for j in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(run_one, jobs))


# The ceiling's p99 TTFT above which a seed is saturated (module doc): the fleet cannot serve
# it even with every prefix everywhere (the 70B headline's ceiling serves its seeds at 0.3-1.3 s).
CEILING_P99_LIMIT_S = 10.0


def saturated(run: dict) -> bool:
    """The ceiling itself cannot serve the seed: ``everywhere``'s p99 above the limit."""
    return why_left_out(run) is not None


def why_left_out(run: dict) -> str | None:
    """Why a seed is left out (None: it is not)."""
    ceiling = run["policies"].get(CEILING)
    if ceiling is None or ceiling["ttft_p99_s"] <= CEILING_P99_LIMIT_S:
        return None
    return (
        f"{CEILING} p99 {ceiling['ttft_p99_s']:.2f} s > {CEILING_P99_LIMIT_S:g} s: "
        "the fleet cannot serve it"
    )


def left_out(runs: list[dict]) -> list[dict]:
    """The seeds left out of a cell's gains, each with why."""
    return [{"seed": r["seed"], "why": w} for r in runs if (w := why_left_out(r)) is not None]


def _noise(xs: list[float]) -> float | None:
    ci = stats.mean_interval(xs)
    return None if ci is None else ci.half_width


def summarize_cell(runs: list[dict]) -> dict:
    """Per-policy means over seeds, paired gains over reactive, predictive's VRAM/precision."""
    pols = runs[0]["policies"]
    sat = [r["seed"] for r in runs if saturated(r)]
    kept = [r for r in runs if r["seed"] not in sat]
    if len(kept) < 2:
        kept = runs
    out: dict = {
        "seeds": [r["seed"] for r in runs],
        "saturated_seeds": sat,
        "left_out": left_out(runs) if kept is not runs else [],
        "saturation_rule": f"{CEILING} p99 > {CEILING_P99_LIMIT_S:g} s",
        "gains_over": "unsaturated seeds" if kept is not runs else "all seeds",
        "seeds_measured": [r["seed"] for r in kept],
        "warmup_s": runs[0].get("warmup", 0.0),  # not-vocabulary: seconds before measuring
        "ttft_s": {},
        "ttft_s_noise": {},
    }
    _ttft(out, pols, runs, kept)
    _gains_over_reactive(out, pols, runs, kept)
    _predictive_over_baselines(out, pols, kept)
    _ceiling_and_predictive(out, pols, runs, kept)
    return out


def _ttft(out: dict, pols: dict, runs: list[dict], kept: list[dict]) -> None:
    """The offered load, each policy's mean and p99 TTFT over the kept seeds (with their noise)
    and per seed."""
    loads = [r.get("offered_load") or {} for r in runs]
    out["offered_load"] = {
        k: sum(x.get(k, 0.0) for x in loads) / len(loads) for k in ("peak_5min", "mean")
    }
    for name in pols:
        out["ttft_s"][name] = {
            stat: sum(r["policies"][name][f"ttft_{stat}_s"] for r in kept) / len(kept)
            for stat in ("mean", "p99")
        }
        out["ttft_s_noise"][name] = {
            stat: _noise([r["policies"][name][f"ttft_{stat}_s"] for r in kept])
            for stat in ("mean", "p99")
        }
    out["per_seed_ttft_s"] = {
        name: [
            {stat: r["policies"][name][f"ttft_{stat}_s"] for stat in ("mean", "p99")} for r in runs
        ]
        for name in pols
    }


def _gains_over_reactive(out: dict, pols: dict, runs: list[dict], kept: list[dict]) -> None:
    """Each policy's paired gain over reactive: over the kept seeds and over all of them."""
    for name in ("predictive", CEILING, *BASELINES, "clairvoyant"):
        if name not in pols:
            continue
        for stat in ("mean", "p99"):
            g = gain_stats(
                [r["policies"]["reactive"][f"ttft_{stat}_s"] for r in kept],
                [r["policies"][name][f"ttft_{stat}_s"] for r in kept],
            )
            out[f"{name}_gain_{stat}"] = g["mean"]
            out[f"{name}_gain_{stat}_noise"] = g["noise"]
            out[f"{name}_gain_{stat}_per_seed"] = g["per_seed"]
            out[f"{name}_gain_{stat}_beyond_noise"] = g["beyond_noise"]
            a = gain_stats(
                [r["policies"]["reactive"][f"ttft_{stat}_s"] for r in runs],
                [r["policies"][name][f"ttft_{stat}_s"] for r in runs],
            )
            out[f"{name}_gain_{stat}_all_seeds"] = a["mean"]
            out[f"{name}_gain_{stat}_all_seeds_noise"] = a["noise"]


def _predictive_over_baselines(out: dict, pols: dict, kept: list[dict]) -> None:
    """Predictive's paired gain over each baseline that ran beside it."""
    for base in BASELINES:
        if base not in pols or "predictive" not in pols:
            continue
        key = base.replace("-", "_")
        for stat in ("mean", "p99"):
            g = gain_stats(
                [r["policies"][base][f"ttft_{stat}_s"] for r in kept],
                [r["policies"]["predictive"][f"ttft_{stat}_s"] for r in kept],
            )
            out[f"predictive_over_{key}_{stat}"] = g["mean"]
            out[f"predictive_over_{key}_{stat}_noise"] = g["noise"]
            out[f"predictive_over_{key}_{stat}_beyond_noise"] = g["beyond_noise"]
            out[f"predictive_over_{key}_{stat}_per_seed"] = g["per_seed"]


def _ceiling_and_predictive(out: dict, pols: dict, runs: list[dict], kept: list[dict]) -> None:
    """The gap closed against the ceiling, reactive's spread over seeds, predictive's VRAM,
    precision and replicas, and each policy's bytes moved."""
    if CEILING in pols and "predictive" in pols:
        out["gap_closed_p99_bootstrap"] = bootstrap_gap(kept)
        # Not true by construction: a copy policy can beat the ceiling only where the
        # ceiling's free placement still queues (it routes by the same cache-aware rule).
        out["ceiling_beats_predictive_every_seed"] = all(
            r["policies"][CEILING]["ttft_p99_s"] <= r["policies"]["predictive"]["ttft_p99_s"]
            for r in runs
        )
    for stat in ("mean", "p99"):
        xs = [r["policies"]["reactive"][f"ttft_{stat}_s"] for r in kept]
        out[f"reactive_{stat}_spread"] = (max(xs) - min(xs)) / (sum(xs) / len(xs))
    if "predictive" in pols:
        pred = [r["policies"]["predictive"] for r in kept]
        out["spec_vram_fraction_mean"] = sum(p["spec_vram_fraction_mean"] for p in pred) / len(pred)
        prec = [p["replica_precision"] for p in pred if p["replica_precision"] is not None]
        out["replica_precision"] = sum(prec) / len(prec) if prec else None
        out["speculative_replicas"] = sum(p["speculative_replicas"] for p in pred) / len(pred)
    for name in pols:
        out.setdefault("bytes_moved_mean", {})[name] = sum(
            r["policies"][name]["bytes_moved"] for r in kept
        ) / len(kept)


def seeds_text(c: dict) -> str:
    """A table's seeds cell: how many the gains are over (their degrees of freedom), of how
    many, and which were left out and why (``why_left_out``)."""
    used = c.get("seeds_measured") or [
        x for x in c["seeds"] if x not in (c.get("saturated_seeds") or [])
    ]
    text = f"{len(used)} of {len(c['seeds'])} (df {max(0, len(used) - 1)})"
    out = c.get("left_out") or [
        {"seed": x, "why": "saturated"} for x in c.get("saturated_seeds") or []
    ]
    if out:
        text += "; left out: " + "; ".join(f"seed {x['seed']} ({x['why']})" for x in out)
    return text


def bootstrap_gap(runs: list[dict], stat: str = "p99", draws: int = 2000, seed: int = 0) -> dict:
    """Gap closed against the ceiling, ``sum(reactive - predictive) / sum(reactive -
    everywhere)`` of per-seed TTFT, with a paired percentile bootstrap 95% interval (seeds
    resampled with replacement, ``core.stats.bootstrap``; a resample where the ceiling gains
    nothing is left out and counted)."""
    rows = [
        tuple(x["policies"][n][f"ttft_{stat}_s"] for n in ("reactive", "predictive", CEILING))
        for x in runs
    ]

    def ratio(sample: list[tuple]) -> float | None:
        gap = sum(r - c for r, _, c in sample)
        return sum(r - p for r, p, _ in sample) / gap if gap > 0 else None

    ci, empty = stats.bootstrap(rows, ratio, draws=draws, seed=seed)
    return {
        "ratio": ratio(rows),
        "ci95": [ci.low, ci.high] if ci else [None, None],
        "against": CEILING,
        "draws": draws,
        "draws_without_gap": empty,
    }


def gap_closed(cell: dict, stat: str = "p99") -> float | None:
    """Share of the reactive -> everywhere gap that predictive closes (None: the ceiling gains
    nothing beyond noise)."""
    key = f"{CEILING}_gain_{stat}"
    if not cell.get(f"{key}_beyond_noise") or cell[key] <= 0:
        return None
    return cell[f"predictive_gain_{stat}"] / cell[key]


def main_seeds(args) -> int:
    seeds = [int(x) for x in str(args.seeds).split(",")]
    cells = KEY_CELLS if not args.cells else [tuple(c.split(":")) for c in args.cells.split(",")]
    policies = args.policies.split(",")
    if "reactive" not in policies:
        raise SystemExit("--policies must include reactive (the baseline of every gain)")
    if args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    jobs = [
        {
            "model": m,
            "scenario": s,
            "seed": seed,
            "policies": policies,
            "duration": args.duration,
            "load": args.load,
            "warmup": args.warmup,  # not-vocabulary: seconds before measuring
            "engines": args.engines,
            "tenants": args.tenants,
            "trace_dir": args.trace_dir,
            "clients": args.clients,
        }
        for m, s in cells
        for seed in seeds
    ]
    results = run_jobs(jobs, args.workers)
    doc = {
        "duration_s": args.duration,
        "load": args.load,
        "warmup_s": args.warmup,
        "load_calibration": "busiest 5 minutes of expected demand",
        "tenants": args.tenants,
        "trace_dir": args.trace_dir,
        "clients": args.clients,
        "seeds": seeds,
        "cells": [],
    }
    for m, s in cells:
        runs = [r for r in results if r["model"] == m and r["scenario"] == s]
        cell = {"model": m, "scenario": s, **summarize_cell(runs)}
        cell["gap_closed_p99"] = gap_closed(cell)
        doc["cells"].append(cell)
        print(_line(cell), flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    return 0


def markdown(doc: dict) -> str:
    """The per-cell table of ``docs/simulator.md`` (means over seeds; gains ± 95% noise): gap
    closed is against ``everywhere``, the ceiling; ``hot-fanout`` and ``clairvoyant`` (a
    reference policy) get columns where a cell ran them."""
    cells = doc["cells"]
    extra = [n for n in ("hot-fanout", "clairvoyant") if any(n in c["ttft_s"] for c in cells)]
    over_hf = "hot-fanout" in extra
    head = (
        "| model | scenario | seeds | cache-aware mean / p99 | reactive mean / p99 | "
        "predictive mean / p99 | "
        + "".join(f"{n} mean / p99 | " for n in extra)
        + f"{CEILING} mean / p99 | predictive gain mean | predictive gain p99 | "
        + ("predictive over hot-fanout p99 | " if over_hf else "")
        + f"{CEILING} gain mean | {CEILING} gain p99 | gap closed p99 (vs {CEILING}) | "
        "spec VRAM % | precision |"
    )
    rows = [head, "|" + "---|" * (14 + len(extra) + over_hf)]
    for c in cells:
        closed = c.get("gap_closed_p99")
        prec = c.get("replica_precision")
        seeds = seeds_text(c)
        rows.append(
            f"| {c['model']} | {c['scenario']} | {seeds} | {_mp(c, 'cache-aware')} | "
            f"{_mp(c, 'reactive')} | {_mp(c, 'predictive')} | "
            + "".join(f"{_mp(c, n)} | " for n in extra)
            + f"{_mp(c, CEILING)} | "
            + f"{_g(c, 'predictive', 'mean')} | {_g(c, 'predictive', 'p99')} | "
            + (f"{_gain(c, 'predictive_over_hot_fanout_p99')} | " if over_hf else "")
            + f"{_g(c, CEILING, 'mean')} | {_g(c, CEILING, 'p99')} | "
            f"{_closed(c, closed)} | "
            f"{100 * c['spec_vram_fraction_mean']:.2f} | "
            f"{'-' if prec is None else f'{prec:.2f}'} |"
        )
    return "\n".join(rows)


def _closed(c: dict, closed: float | None) -> str:
    """Gap closed where the ceiling gains beyond noise: the ratio of summed per-seed gaps with
    its bootstrap interval where the cell has one (the grid's headline figure), else the ratio
    of mean gains."""
    if closed is None:
        return "no gap"
    b = c.get("gap_closed_p99_bootstrap") or {}
    lo, hi = (b.get("ci95") or [None, None])[:2]
    if b.get("ratio") is None or lo is None:
        return f"{closed:.0%}"
    return f"{b['ratio']:.0%} [{lo:.0%}, {hi:.0%}]"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _line(c: dict) -> str:
    t = c["ttft_s"]
    return (
        f"{c['model']:<11} {c['scenario']:<9} reactive {t['reactive']['mean']:.3f}/"
        f"{t['reactive']['p99']:.3f}  predictive gain mean {c['predictive_gain_mean']:+.1%}"
        f"±{pct(c['predictive_gain_mean_noise'])} p99 {c['predictive_gain_p99']:+.1%}"
        f"±{pct(c['predictive_gain_p99_noise'])}"
        + (
            f"  {CEILING} p99 {c[f'{CEILING}_gain_p99']:+.1%}±{pct(c[f'{CEILING}_gain_p99_noise'])}"
            if f"{CEILING}_gain_p99" in c
            else ""
        )
    )


def _mp(c: dict, name: str) -> str:
    t = c["ttft_s"]
    return f"{t[name]['mean']:.3f} / {t[name]['p99']:.3f}" if name in t else "-"


def _g(c: dict, name: str, stat: str) -> str:
    return _gain(c, f"{name}_gain_{stat}")


def _gain(c: dict, key: str) -> str:
    """A cell's paired gain ``key`` ± its 95% noise, bold when beyond it; "-" where not run."""
    if key not in c:
        return "-"
    mark = "**" if c[f"{key}_beyond_noise"] else ""
    return f"{mark}{c[key]:+.1%}{mark} ± {pct(c[f'{key}_noise'])}"
