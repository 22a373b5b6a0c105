"""The client halves' results: per half and cell, predictive's paired p99 gain over the shipped
reactive (mean +- 95% Student t half-width, its degrees of freedom), over the routing-time rule
and hot fanout where they ran, the seeds left out and why, and every seed's p99s and ratios.

Reads ``tune.jsonl`` and ``holdout.jsonl`` (``run.sh``; a seed's policies come in two jobs and
are put together here), writes ``results.json`` and prints the tables of the README.

    PYTHONPATH=. .venv/bin/python experiments/client-halves/summary.py
"""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.core import stats
from controlplane.sim.seeds import summarize_cell, why_left_out
from controlplane.sim.workloads import servegen as sg

HERE = Path(__file__).parent
HALVES = ("tune", "holdout")
CORE = ("reactive", "predictive", "everywhere")
NAMES = ("reactive", "routing-reactive", "hot-fanout", "predictive", "everywhere")
DURATION_S = 1200.0


def seeds_of(half: str) -> dict[str, list[dict]]:
    """Per cell, one record per seed with every policy its jobs ran, by seed."""
    path = HERE / f"{half}.jsonl"
    got: dict[tuple[str, int], dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        r = json.loads(line)
        if r.get("clients") != half:
            raise ValueError(f"{path}: a record of clients={r.get('clients')!r}")
        have = got.setdefault((r["scenario"], r["seed"]), {**r, "policies": {}})
        have["policies"].update(r["policies"])
    out: dict[str, list[dict]] = {}
    for (scenario, _), r in sorted(got.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out.setdefault(scenario, []).append(r)
    return out


def _only(runs: list[dict], names) -> list[dict]:
    return [
        {**r, "policies": {n: r["policies"][n] for n in names}}
        for r in runs
        if all(n in r["policies"] for n in names)
    ]


def cell_summary(runs: list[dict]) -> dict:
    core = summarize_cell(_only(runs, CORE))
    used = core["seeds_measured"]
    out = {
        "seeds_run": core["seeds"],
        "seeds_used": used,
        "df": len(used) - 1,
        "left_out": core["left_out"],
        "saturation_rule": core["saturation_rule"],
        "offered_load": core["offered_load"],
        "ttft_p99_s_mean": {n: v["p99"] for n, v in core["ttft_s"].items()},
        "predictive_gain_p99": core["predictive_gain_p99"],
        "predictive_gain_p99_noise": core["predictive_gain_p99_noise"],
        "predictive_gain_p99_beyond_noise": core["predictive_gain_p99_beyond_noise"],
        "predictive_gain_p99_per_seed": core["predictive_gain_p99_per_seed"],
        "predictive_gain_mean": core["predictive_gain_mean"],
        "predictive_gain_mean_noise": core["predictive_gain_mean_noise"],
        "gap_closed_p99_vs_everywhere": core["gap_closed_p99_bootstrap"],
    }
    full = _only(runs, NAMES)
    if len(full) >= 2:
        s = summarize_cell(full)
        out["with_baselines"] = {"seeds_used": s["seeds_measured"], "left_out": s["left_out"]}
        for base in ("routing_reactive", "hot_fanout"):
            k = f"predictive_over_{base}_p99"
            out["with_baselines"][k] = [s[k], s[f"{k}_noise"], s[f"{k}_beyond_noise"]]
    out["per_seed"] = [_seed_row(r) for r in runs if all(n in r["policies"] for n in CORE)]
    return out


def _seed_row(r: dict) -> dict:
    p = {n: r["policies"][n]["ttft_p99_s"] for n in NAMES if n in r["policies"]}
    row = {
        "seed": r["seed"],
        "p99_s": p,
        "predictive_over_reactive": p["predictive"] / p["reactive"],
    }
    if "routing-reactive" in p and "hot-fanout" in p:
        best = min(p["routing-reactive"], p["hot-fanout"])
        row["reactive_over_best_baseline"] = p["reactive"] / best
        row["predictive_over_best_baseline"] = p["predictive"] / best
    row["left_out"] = why_left_out(r)
    row["offered_load"] = r.get("offered_load")
    return row


def workload_facts() -> dict:
    """Each half's clients, the window its ramp rule picks, its busiest tenants there, and which
    of every client's busiest tenants (the headline's) each half holds."""
    windows = sg.load_servegen_windows(None)
    halves = sg.client_halves(windows)
    every_start = sg.ramp_start(windows, DURATION_S)
    headline = list(sg.top_tenants(None, 30, every_start, DURATION_S))
    facts = {"all": {"start_s": every_start, "busiest_30": headline}}
    for half in HALVES:
        start = sg.ramp_start(sg.select_clients(windows, half), DURATION_S)
        facts[half] = {
            "clients": sorted(halves[half], key=lambda n: int(n.split("-")[1])),
            "start_s": start,
            "busiest_30": list(sg.top_tenants(None, 30, start, DURATION_S, half)),
            "headline_tenants_held": [n for n in headline if n in halves[half]],
        }
    return facts


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _gain(g: float, noise: float | None, beyond: bool) -> str:
    mark = "**" if beyond else ""
    return f"{mark}{g:+.1%}{mark} ± {pct(noise)}"


def tables(doc: dict) -> str:
    rows = [
        "| half | cell | seeds used (df); left out (why) | predictive p99 gain over reactive "
        "| over routing-reactive (seeds) | over hot-fanout | worst seed predictive / reactive "
        "| offered load peak 5 min |",
        "|" + "---|" * 8,
    ]
    for c in doc["cells"]:
        out = "; ".join(f"seed {x['seed']} ({x['why']})" for x in c["left_out"]) or "none"
        wb = c.get("with_baselines")
        rr, hf = (
            ("-", "-")
            if not wb
            else (
                _gain(*wb["predictive_over_routing_reactive_p99"]) + f" ({len(wb['seeds_used'])})",
                _gain(*wb["predictive_over_hot_fanout_p99"]),
            )
        )
        kept = [s for s in c["per_seed"] if s["left_out"] is None]
        w = max(kept, key=lambda s: s["predictive_over_reactive"]) if kept else None
        worst = "-" if w is None else f"seed {w['seed']}: {w['predictive_over_reactive']:.2f}x"
        rows.append(
            f"| {c['half']} | {c['scenario']} | {len(c['seeds_used'])} of {len(c['seeds_run'])} "
            f"(df {c['df']}); left out: {out} | "
            f"{_gain(c['predictive_gain_p99'], c['predictive_gain_p99_noise'], c['predictive_gain_p99_beyond_noise'])} | "
            f"{rr} | {hf} | {worst} | {c['offered_load']['peak_5min']:.2f} |"
        )
    rows += [
        "",
        "| half | cell | seed | "
        + " | ".join(f"{n} p99 s" for n in NAMES)
        + " | predictive / reactive | reactive / best baseline | predictive / best baseline "
        "| left out |",
        "|" + "---|" * (len(NAMES) + 7),
    ]
    for c in doc["cells"]:
        for s in c["per_seed"]:
            p = s["p99_s"]
            rows.append(
                f"| {c['half']} | {c['scenario']} | {s['seed']} | "
                + " | ".join(f"{p[n]:.2f}" if n in p else "-" for n in NAMES)
                + f" | {s['predictive_over_reactive']:.2f}x | "
                + " | ".join(
                    f"{s[k]:.2f}x" if k in s else "-"
                    for k in ("reactive_over_best_baseline", "predictive_over_best_baseline")
                )
                + f" | {s['left_out'] or '-'} |"
            )
    return "\n".join(rows)


def halves_compared(cells: list[dict]) -> list[dict]:
    """Per cell, holdout's mean p99 gain minus tune's (per-seed gains over the seeds used),
    with Welch's 95% t interval and its degrees of freedom."""
    out = []
    for scenario in sorted({c["scenario"] for c in cells}):
        by = {c["half"]: c for c in cells if c["scenario"] == scenario}
        if set(by) != set(HALVES):
            continue
        ci = stats.welch(
            by["holdout"]["predictive_gain_p99_per_seed"],
            by["tune"]["predictive_gain_p99_per_seed"],
        )
        if ci is not None:
            out.append(
                {
                    "scenario": scenario,
                    "holdout_minus_tune": ci.estimate,
                    "ci95": [ci.low, ci.high],
                    "df": ci.df,
                }
            )
    return out


def main() -> None:
    cells = []
    for half in HALVES:
        for scenario, runs in seeds_of(half).items():
            if len(_only(runs, CORE)) >= 2:
                cells.append({"half": half, "scenario": scenario, **cell_summary(runs)})
    doc = {
        "model": "llama3-70b",
        "duration_s": DURATION_S,
        "warmup_s": 300.0,
        "load": 0.55,
        "tenants": 30,
        "workload": workload_facts(),
        "cells": cells,
        "halves_compared": halves_compared(cells),
    }
    (HERE / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(tables(doc))
    for h in doc["halves_compared"]:
        lo, hi = h["ci95"]
        print(
            f"{h['scenario']}: holdout - tune p99 gain {h['holdout_minus_tune']:+.1%} "
            f"[{lo:+.1%}, {hi:+.1%}] (Welch, df {h['df']:.1f})"
        )


if __name__ == "__main__":
    main()
