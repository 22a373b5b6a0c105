"""``prewarm-sim sweep``: where speculation pays.

Runs ``reactive``, ``predictive`` and ``everywhere`` (the ceiling) on ServeGen tenants over a grid of copy time
(mean prefix length x link bandwidth: the time a reactive copy needs once a burst starts) and
load, and reports the p99 and mean TTFT gain of ``predictive`` and ``everywhere`` over ``reactive``.
The copy time is expressed as a ratio to the burst onset, taken as 60 s (the time ServeGen bursts
take to build: the 1-minute rate crossing 2x the usual). Each cell's gains are paired over seeds
with their own noise (``controlplane.sim.seeds.gain_stats``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from controlplane.core.costmodel import CostModel
from controlplane.core.policy.version import POLICY_VERSION
from controlplane.sim.seeds import CEILING, COMPARED, pct, run_jobs, summarize_cell

BURST_ONSET_S = 60.0


def grid(quick: bool):
    if quick:
        return [(8192, 32768, 25e9), (32768, 131072, 6.25e9)], [0.4, 0.7]
    # Copy time / burst onset from ~0.001 (short prefixes, 200 Gb/s) to ~8 (70B long contexts
    # over a 2 Gb/s share of a busy link); loads (at the busiest 5 minutes) from light to heavy.
    return (
        [
            (2048, 8192, 25e9),
            (8192, 131072, 12.5e9),
            (32768, 131072, 6.25e9),
            (32768, 131072, 1.0e9),
            (32768, 131072, 0.25e9),
        ],
        [0.3, 0.8],
    )


def _jobs(args, contexts, loads, duration, seeds) -> list[dict]:
    return [
        {
            "model": args.model,
            "gpu": args.gpu,
            "gpus_per_engine": args.gpus_per_engine,
            "engines": args.engines,
            "tenants": args.tenants,
            "scenario": "slowlink",
            "seed": seed,
            "duration": duration,
            "load": load,
            "prefix_tokens": (lo, hi),
            "link_bytes_per_s": bw,
            "warmup": args.warmup,  # not-vocabulary: seconds before measuring
            "policies": list(COMPARED),
            "trace_dir": getattr(args, "trace_dir", None),
        }
        for lo, hi, bw in contexts
        for load in loads
        for seed in seeds
    ]


def _cell(runs: list[dict]) -> dict:
    lo, hi = runs[0]["prefix_tokens"]
    bw, load = runs[0]["link_bytes_per_s"], runs[0]["load"]
    kv = CostModel.preset(runs[0]["model"], runs[0]["gpu"]).kv_bytes_per_token
    mean_tokens = (hi - lo) / math.log(hi / lo)
    copy_s = mean_tokens * kv / (bw * (1 - load))
    cell = {
        "prefix_tokens": [lo, hi],
        "link_gbytes_per_s": bw / 1e9,
        "load": load,
        "copy_s": copy_s,
        "copy_to_onset": copy_s / BURST_ONSET_S,
        **summarize_cell(runs),
    }
    for name in ("predictive", CEILING):
        for stat in ("p99", "mean"):
            gains = cell[f"{name}_gain_{stat}_per_seed"]
            cell[f"{name}_gain_{stat}_spread"] = max(gains) - min(gains)
    return cell


def main_sweep(args) -> int:
    contexts, loads = grid(args.quick)
    duration = 600.0 if args.quick else args.duration
    seeds = [int(x) for x in str(args.seeds).split(",")] if args.seeds else [args.seed]
    results = run_jobs(_jobs(args, contexts, loads, duration, seeds), args.workers)
    cells = []
    for lo, hi, bw in contexts:
        for load in loads:
            runs = [
                r
                for r in results
                if r["prefix_tokens"] == (lo, hi)
                and r["link_bytes_per_s"] == bw
                and r["load"] == load
            ]
            cell = _cell(runs)
            cells.append(cell)
            print(
                f"copy/onset {cell['copy_to_onset']:.3f} load {load:.2f}: p99 gain predictive "
                f"{cell['predictive_gain_p99']:+.1%} ±{pct(cell['predictive_gain_p99_noise'])} "
                f"{CEILING} {cell[f'{CEILING}_gain_p99']:+.1%}; mean gain predictive "
                f"{cell['predictive_gain_mean']:+.1%} ±{pct(cell['predictive_gain_mean_noise'])}",
                flush=True,
            )
    # Kept for readers of the old schema: the largest per-cell noise.
    noise = {
        stat: max(
            (
                c[f"predictive_gain_{stat}_noise"]
                for c in cells
                if c[f"predictive_gain_{stat}_noise"] is not None
            ),
            default=0.0,
        )
        for stat in ("p99", "mean")
    }
    doc = {
        "policy_version": POLICY_VERSION,  # the policy that made it (speculation_map.stale)
        "burst_onset_s": BURST_ONSET_S,
        "model": args.model,
        "gpu": args.gpu,
        "engines": args.engines,
        "duration_s": duration,
        "warmup_s": args.warmup,
        "load_calibration": "busiest 5 minutes of expected demand",
        "seeds": seeds,
        "noise": noise,
        "noise_kind": "per cell: 95% CI half-width of the mean paired gain over seeds",
        "cells": cells,
    }
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=1) + "\n")
    if args.html_path:
        _html(cells, loads, args.html_path)
    print(markdown(doc))
    return 0


def markdown(doc: dict) -> str:
    """The map's table in ``docs/simulator.md`` (gains ± the cell's 95% noise, **bold** beyond it)."""
    from controlplane.sim.seeds import _g
    from controlplane.sim.speculation_map import advice

    head = (
        "| prefix tokens | link GB/s | load | copy / onset | reactive mean / p99 s | "
        "predictive gain p99 | predictive gain mean | ceiling gain p99 | ceiling gain mean | "
        "spec VRAM % | precision | saturated seeds | advice |"
    )
    rows = [head, "|" + "---|" * 13]
    for c in doc["cells"]:
        lo, hi = c["prefix_tokens"]
        t = c["ttft_s"]["reactive"]
        prec = c.get("replica_precision")
        verdict = advice(c["copy_to_onset"], c["load"], {**doc, "cells": [c]})["verdict"]
        rows.append(
            f"| {lo // 1024}k-{hi // 1024}k | {c['link_gbytes_per_s']:.2f} | {c['load']:.2f} | "
            f"{c['copy_to_onset']:.3f} | {t['mean']:.3f} / {t['p99']:.3f} | "
            f"{_g(c, 'predictive', 'p99')} | {_g(c, 'predictive', 'mean')} | "
            f"{_g(c, CEILING, 'p99')} | {_g(c, CEILING, 'mean')} | "
            f"{100 * c['spec_vram_fraction_mean']:.2f} | {'-' if prec is None else f'{prec:.2f}'} | "
            f"{len(c.get('saturated_seeds') or [])} | {verdict} |"
        )
    return "\n".join(rows)


def _html(cells, loads, path) -> None:
    xs = sorted({round(c["copy_to_onset"], 4) for c in cells})
    figs = []
    for key in ("predictive_gain_p99", f"{CEILING}_gain_p99", "predictive_gain_mean"):
        z = [
            [
                next(
                    (
                        100 * c[key]
                        for c in cells
                        if c["load"] == ld and round(c["copy_to_onset"], 4) == x
                    ),
                    None,
                )
                for x in xs
            ]
            for ld in loads
        ]
        fig = go.Figure(
            go.Heatmap(x=[f"{x:.3f}" for x in xs], y=loads, z=z, colorbar={"title": "%"})
        )
        fig.update_layout(
            title=f"{key} over reactive (%)",
            xaxis_title="copy time / burst onset",
            yaxis_title="load",
        )
        figs.append(fig.to_html(full_html=False, include_plotlyjs=False))
    Path(path).write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><script>{get_plotlyjs()}</script>"
        "</head><body><h1>Where speculation pays</h1>" + "".join(figs) + "</body></html>"
    )
