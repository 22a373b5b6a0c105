"""``prewarm-sim grid``: the do-no-harm robustness grid, resumable.

A *setting* is a workload and its knobs: ``servegen`` (ServeGen m-large, load 0.55 at the
busiest 5 minutes, 30 tenants, 16 engines), one axis changed at a time (``servegen-load0.35``,
``-load0.7``, ``-t15``, ``-t60``, ``-e8``, ``-e32``), ``mooncake`` (conversation trace) and
``azure-code`` (code trace, with the synthetic Zipf repository prefixes the simulator assigns;
see ``workloads/azure.py``). A *cell* is a setting x model x scenario; each seed is one job (for
the two fixed traces a seed is a window start, ``seeds.WINDOW_STEP_S`` apart, see
``seeds.run_one``). Every job's result is appended to ``--jsonl`` as it finishes, and jobs already
there are skipped, so an interrupted grid resumes where it stopped. One parameter set for every
cell: the policies' defaults.

Per cell: the paired p99 and mean gains of ``predictive`` over ``reactive`` (unsaturated seeds,
95% Student t noise), the worst unsaturated seed (highest predictive / reactive p99 ratio), and
whether the cell is clean: no loss beyond noise and no unsaturated seed above ``HARM_RATIO``.
Where the runs hold the baselines beside reactive (``seeds.BASELINES``: the routing-time rule
and hot fanout), each strategy is also held against them (``against_baselines``): not worse
beyond noise than either, and no unsaturated seed above ``HARM_RATIO`` x the better of the two
on that seed.
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from controlplane.sim.grid_baselines import (
    HARM_RATIO,
    against_baselines,
    baselines_markdown,
    worse_beyond_noise,
)
from controlplane.sim.seeds import (
    BASELINES,
    _g,
    _mp,
    bootstrap_gap,
    gain_stats,
    gap_closed,
    left_out,
    pct,
    run_one,
    saturated,
    seeds_text,
    summarize_cell,
)

SETTINGS: dict[str, dict] = {
    "servegen": {},
    "servegen-load0.35": {"load": 0.35},
    "servegen-load0.7": {"load": 0.7},
    "servegen-t15": {"tenants": 15},
    "servegen-t60": {"tenants": 60},
    "servegen-e8": {"engines": 8},
    "servegen-e32": {"engines": 32},
    "mooncake": {"workload": "mooncake"},
    "azure-code": {"workload": "azure-code"},
}
# The full robustness grid (``--cells full``): every trace, with ServeGen's knobs crossed
# (loads x fleets x tenants); the two fixed traces carry their own load and clients, so only
# their fleet varies. One parameter set for every cell: the policies' defaults.
FULL_LOADS = (0.35, 0.55, 0.7)
FULL_FLEETS = (8, 16, 32)
FULL_TENANTS = (15, 30, 60)
FULL_SETTINGS: dict[str, dict] = {
    **{
        f"servegen-load{load}-e{e}-t{t}": {"load": load, "engines": e, "tenants": t}
        for load in FULL_LOADS
        for e in FULL_FLEETS
        for t in FULL_TENANTS
    },
    **{
        f"{w}-e{e}": {"workload": w, "engines": e}
        for w in ("mooncake", "azure-code")
        for e in FULL_FLEETS
    },
}
MODELS = ("llama3-70b", "llama3-8b")
SCENARIOS = ("steady", "scaleout", "slowlink", "tiered")


def all_cells() -> list[tuple[str, str, str]]:
    return [(s, m, sc) for s in SETTINGS for m in MODELS for sc in SCENARIOS]


def full_cells() -> list[tuple[str, str, str]]:
    return [(s, m, sc) for s in FULL_SETTINGS for m in MODELS for sc in SCENARIOS]


def settings_of(setting: str) -> dict:
    return SETTINGS[setting] if setting in SETTINGS else FULL_SETTINGS[setting]


def parse_cells(text: str | None) -> list[tuple[str, str, str]]:
    """``setting:model:scenario,...``; empty: the one-axis grid (``SETTINGS``); ``full``: the
    full robustness grid (``FULL_SETTINGS``)."""
    if not text:
        return all_cells()
    if text == "full":
        return full_cells()
    out = []
    for part in text.split(","):
        bits = part.split(":")
        known = bits[0] in SETTINGS or bits[0] in FULL_SETTINGS
        if len(bits) != 3 or not known or bits[2] not in SCENARIOS:
            raise ValueError(
                f"cell {part!r}: want setting:model:scenario with a setting in "
                f"{', '.join(SETTINGS)} and a scenario in {', '.join(SCENARIOS)}"
            )
        out.append((bits[0], bits[1], bits[2]))
    return out


def job_for(cell: tuple[str, str, str], seed: int, args) -> dict:
    setting, model, scenario = cell
    return {
        "cell": ":".join(cell),
        "model": model,
        "scenario": scenario,
        "seed": seed,
        "policies": list(args.policies),
        "duration": args.duration,
        "warmup": args.warmup,  # not-vocabulary: the warm-up seconds, not a transport
        "trace_dir": args.trace_dir,
        "clients": getattr(args, "clients", "all"),
        **settings_of(setting),
    }


def _key(job: dict) -> str:
    """A job's identity in ``--jsonl``: cell, seed, policies and, for a client half, the half
    (runs of one half never stand in for the other's)."""
    half = job.get("clients", "all")
    tail = "" if half == "all" else f"#clients={half}"
    return f"{job['cell']}#{job['seed']}#{','.join(job['policies'])}{tail}"


def run_grid(jobs: list[dict], jsonl: Path | None, workers: int) -> list[dict]:
    done: dict[str, dict] = {}
    if jsonl is not None and jsonl.exists():
        for line in jsonl.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[_key(r)] = r
    todo = [j for j in jobs if _key(j) not in done]

    def keep(r: dict) -> None:
        done[_key(r)] = r
        if jsonl is not None:
            with jsonl.open("a") as f:
                f.write(json.dumps(r) + "\n")

    if workers <= 1:
        for j in todo:
            keep(run_one(j))
    else:
        with ProcessPoolExecutor(workers) as pool:
            for fut in as_completed([pool.submit(run_one, j) for j in todo]):
                keep(fut.result())
    return [done[_key(j)] for j in jobs]


def summarize(runs: list[dict]) -> dict:
    """One cell: gains of predictive over reactive, the worst unsaturated seed, clean or not."""
    sat = [r["seed"] for r in runs if saturated(r)]
    kept = [r for r in runs if r["seed"] not in sat] or runs
    out: dict = {
        "seeds": [r["seed"] for r in runs],
        "saturated_seeds": sat,
        "seeds_measured": [r["seed"] for r in kept],
        "left_out": left_out(runs) if len(kept) < len(runs) else [],
    }
    for stat in ("mean", "p99"):
        g = gain_stats(
            [r["policies"]["reactive"][f"ttft_{stat}_s"] for r in kept],
            [r["policies"]["predictive"][f"ttft_{stat}_s"] for r in kept],
        )
        out[f"gain_{stat}"], out[f"gain_{stat}_noise"] = g["mean"], g["noise"]
    ratios = [
        (
            r["policies"]["predictive"]["ttft_p99_s"]
            / max(1e-9, r["policies"]["reactive"]["ttft_p99_s"]),
            r["seed"],
            r["policies"]["reactive"]["ttft_p99_s"],
            r["policies"]["predictive"]["ttft_p99_s"],
        )
        for r in runs
        if r["seed"] not in sat
    ]
    worst = max(ratios) if ratios else None
    out["worst_seed"] = (
        None
        if worst is None
        else {
            "seed": worst[1],
            "ratio": worst[0],
            "reactive_p99": worst[2],
            "predictive_p99": worst[3],
        }
    )
    if all("everywhere" in r["policies"] for r in kept):
        # Gap closed against the ceiling (every prefix free on every engine), the same rule as
        # the headline's (``seeds.bootstrap_gap``): sum(reactive - predictive) / sum(reactive -
        # everywhere) of per-seed p99, with its bootstrap interval over seeds.
        ev = gain_stats(
            [r["policies"]["reactive"]["ttft_p99_s"] for r in kept],
            [r["policies"]["everywhere"]["ttft_p99_s"] for r in kept],
        )
        out["everywhere_gain_p99"] = ev["mean"]
        gap = bootstrap_gap(kept)
        out["gap_closed_everywhere_p99"] = gap["ratio"]
        out["gap_closed_everywhere_p99_ci95"] = gap["ci95"]
    # One measured seed gives no "loses beyond noise" verdict (its ratio counts).
    loses = any(
        worse_beyond_noise(out[f"gain_{s}"], out[f"gain_{s}_noise"]) for s in ("p99", "mean")
    )
    out["clean"] = not loses and (worst is None or worst[0] <= HARM_RATIO)
    if all(b in r["policies"] for r in runs for b in BASELINES):
        out["against_baselines"] = {
            name: against_baselines(runs, kept, sat, name) for name in ("reactive", "predictive")
        }
    return out


def markdown(cells: list[dict]) -> str:
    rows = [
        "| setting | model | scenario | seeds used (df); left out (why) | reactive p99 | "
        "predictive p99 | "
        "gain p99 | gain mean | worst seed: reactive / predictive p99 (ratio) | "
        "gap closed vs everywhere p99 | clean |",
        "|" + "---|" * 11,
    ]
    for c in cells:
        w = c["worst_seed"]
        ws = (
            "-"
            if w is None
            else f"seed {w['seed']}: {w['reactive_p99']:.2f} / {w['predictive_p99']:.2f} s "
            f"({w['ratio']:.2f}x)"
        )
        rows.append(
            f"| {c['setting']} | {c['model']} | {c['scenario']} | {seeds_text(c)} | "
            f"{c['reactive_p99']:.2f} | {c['predictive_p99']:.2f} | "
            f"{c['gain_p99']:+.1%} ± {pct(c['gain_p99_noise'])} | "
            f"{c['gain_mean']:+.1%} ± {pct(c['gain_mean_noise'])} | {ws} | {_gap(c)} | "
            f"{'yes' if c['clean'] else '**no**'} |"
        )
    return "\n".join(rows)


def _gap(c: dict) -> str:
    g = c.get("gap_closed_everywhere_p99")
    if g is None:
        return "-" if "everywhere_gain_p99" not in c else "no gap"
    return f"{g:.0%}"


def headline_markdown(cells: list[dict]) -> str:
    rows = [
        "| model | scenario | seeds used (df); left out (why) | reactive (shipped) | "
        "routing-reactive | hot-fanout | predictive | clairvoyant | everywhere (ceiling) | "
        "predictive gain p99 over reactive | over routing-reactive | over hot-fanout | "
        "ceiling gain p99 | gap closed p99 vs everywhere [95% bootstrap] | "
        "ceiling >= predictive every seed | spec VRAM % | precision |",
        "|" + "---|" * 17,
    ]
    for c in cells:
        b = c.get("gap_closed_p99_bootstrap") or {}
        lo, hi = (b.get("ci95") or [None, None])[:2]
        gap = (
            "no gap"
            if b.get("ratio") is None
            else f"{b['ratio']:.0%} [{lo:.0%}, {hi:.0%}]"
            if lo is not None
            else f"{b['ratio']:.0%}"
        )
        prec = c.get("replica_precision")
        rows.append(
            f"| {c['model']} | {c['scenario']} | {seeds_text(c)} | {_mp(c, 'reactive')} | "
            f"{_mp(c, 'routing-reactive')} | {_mp(c, 'hot-fanout')} | "
            f"{_mp(c, 'predictive')} | {_mp(c, 'clairvoyant')} | {_mp(c, 'everywhere')} | "
            f"{_g(c, 'predictive', 'p99')} | {_hf(c, 'routing_reactive')} | {_hf(c)} | "
            f"{_g(c, 'everywhere', 'p99')} | {gap} | "
            f"{'yes' if c.get('ceiling_beats_predictive_every_seed') else 'no'} | "
            f"{100 * c.get('spec_vram_fraction_mean', 0.0):.2f} | "
            f"{'-' if prec is None else f'{prec:.2f}'} |"
        )
    return "\n".join(rows)


def _hf(c: dict, base: str = "hot_fanout") -> str:
    """Predictive's p99 gain over a baseline beside reactive (``seeds.BASELINES``)."""
    key = f"predictive_over_{base}_p99"
    if key not in c:
        return "-"
    mark = "**" if c[f"{key}_beyond_noise"] else ""
    return f"{mark}{c[key]:+.1%}{mark} ± {pct(c[f'{key}_noise'])}"


def main_grid(args) -> int:
    cells = parse_cells(args.cells)
    seeds = [int(x) for x in str(args.seeds).split(",")]
    args.policies = [p for p in args.policies.split(",") if p]
    # Seed-major: an interrupted grid has every cell at the same depth.
    jobs = [job_for(c, s, args) for s in seeds for c in cells]
    jsonl = Path(args.jsonl) if args.jsonl else None
    if getattr(args, "runs_only", False):
        if jsonl is None:
            raise ValueError("--runs-only needs --jsonl (where the runs go)")
        run_grid(jobs, jsonl, args.workers)
        print(f"{len(jobs)} job(s) in {jsonl}")
        return 0
    if "reactive" not in args.policies or "predictive" not in args.policies:
        raise ValueError("--policies must include reactive and predictive (or --runs-only)")
    if args.summarize_only:
        if jsonl is None or not jsonl.exists():
            raise ValueError("--summarize-only needs an existing --jsonl")
        have = {_key(json.loads(x)) for x in jsonl.read_text().splitlines() if x.strip()}
        jobs = [j for j in jobs if _key(j) in have]
        seeds = sorted({j["seed"] for j in jobs})
        cells = [c for c in cells if any(j["cell"] == ":".join(c) for j in jobs)]
    results = run_grid(jobs, jsonl, args.workers)
    out = []
    for c in cells:
        runs = [r for r in results if r["cell"] == ":".join(c)]
        kept = [r for r in runs if not saturated(r)] or runs
        s = summarize(runs)
        for name in ("reactive", "predictive"):
            s[f"{name}_p99"] = sum(r["policies"][name]["ttft_p99_s"] for r in kept) / len(kept)
        out.append({"setting": c[0], "model": c[1], "scenario": c[2], **s})
    doc = {"duration_s": args.duration, "warmup_s": args.warmup, "seeds": seeds, "cells": out}
    doc["clients"] = getattr(args, "clients", "all")
    if "everywhere" in args.policies:
        # The headline form: every policy's means, gains over reactive and hot-fanout, the
        # gap closed against the everywhere ceiling.
        doc["headline"] = []
        for c in cells:
            runs = [r for r in results if r["cell"] == ":".join(c)]
            cell = {"model": c[1], "scenario": c[2], **summarize_cell(runs)}
            cell["gap_closed_p99"] = gap_closed(cell)
            doc["headline"].append(cell)
        print(headline_markdown(doc["headline"]))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(out))
    if any("against_baselines" in c for c in out):
        print()
        print(baselines_markdown(out))
    return 0


def merge_runs(
    base: list[dict], reruns: list[dict], rename: dict[str, str] | None = None
) -> list[dict]:
    """``base`` with some policies rerun: the policies a rerun holds replace the base's or join
    them, the others (those a change does not touch: a planner change leaves the routing-time
    rule, hot-fanout and everywhere as they were) are kept. ``rename`` first renames the base's
    policies (old name -> new): records made before the routing-time rule was renamed call it
    ``reactive``. Records from before the bound was measured against ``everywhere`` may hold an
    ``oracle`` (the better of clairvoyant and predictive itself, not a bound): it is dropped. A
    seed no rerun holds is left out, not mixed."""
    rename = rename or {}
    new: dict[tuple[str, int], dict] = {}
    for r in reruns:
        new.setdefault((r["cell"], r["seed"]), {}).update(r["policies"])
    out = []
    for r in base:
        got = new.get((r["cell"], r["seed"]))
        if not got:
            continue
        kept = {rename.get(n, n): old for n, old in r["policies"].items() if n != "oracle"}
        out.append({**r, "policies": {**kept, **got}})
    return out


def _jsonl(path: str) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def main_merge_runs(args) -> int:
    reruns = [r for path in args.reruns for r in _jsonl(path)]
    rename = {}
    for spec in args.rename:
        old, sep, new = spec.partition("=")
        if not sep or not old or not new:
            raise ValueError(f"--rename {spec!r}: want OLD=NEW")
        rename[old] = new
    merged = merge_runs(_jsonl(args.base), reruns, rename)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in merged))
    print(f"{len(merged)} seed(s) merged into {args.out}")
    return 0
