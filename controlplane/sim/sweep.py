"""``prewarm-sim sweep``: where speculation pays.

Runs ``reactive``, ``predictive`` and ``oracle`` on ServeGen tenants over a grid of copy time
(mean prefix length x link bandwidth: the time a reactive copy needs once a burst starts) and
load, and reports the p99 and mean TTFT gain of ``predictive`` and ``oracle`` over ``reactive``.
The copy time is expressed as a ratio to the burst onset, taken as 60 s (the time ServeGen bursts
take to build: the 1-minute rate crossing 2x the usual).
"""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from controlplane.sim.runner import run_policies
from controlplane.sim.scenarios import build

BURST_ONSET_S = 60.0


def grid(quick: bool):
    if quick:
        return [(8192, 32768, 25e9), (32768, 131072, 6.25e9)], [0.4, 0.7]
    return (
        [(2048, 8192, 25e9), (8192, 32768, 25e9), (8192, 131072, 12.5e9), (32768, 131072, 6.25e9)],
        [0.3, 0.55, 0.8],
    )


def main_sweep(args) -> int:
    contexts, loads = grid(args.quick)
    duration = 600.0 if args.quick else args.duration
    cells = []
    for lo, hi, bw in contexts:
        for load in loads:
            setup = build(workload="servegen", scenario="slowlink", engines=args.engines,
                          model=args.model, gpu=args.gpu, gpus_per_engine=args.gpus_per_engine,
                          duration=duration, load=load, tenants=args.tenants,
                          prefix_tokens=(lo, hi), seed=args.seed)
            setup.config.network_bytes_per_s = bw
            mean_tokens = (hi - lo) / __import__("math").log(hi / lo)
            copy_s = mean_tokens * setup.config.cost.kv_bytes_per_token / (bw * (1 - load))
            doc, _ = run_policies(setup, ["reactive", "predictive", "oracle"], seed=args.seed)
            p = doc["policies"]
            cell = {"prefix_tokens": [lo, hi], "link_gbytes_per_s": bw / 1e9, "load": load,
                    "copy_s": copy_s, "copy_to_onset": copy_s / BURST_ONSET_S}
            for name in ("predictive", "oracle"):
                for stat in ("ttft_p99_s", "ttft_mean_s"):
                    base = p["reactive"][stat]
                    cell[f"{name}_gain_{stat[5:-2]}"] = (base - p[name][stat]) / base if base else 0.0
            cell["policies"] = p
            cells.append(cell)
            print(f"copy/onset {cell['copy_to_onset']:.3f} load {load:.2f}: p99 gain predictive "
                  f"{cell['predictive_gain_p99']:+.1%} oracle {cell['oracle_gain_p99']:+.1%}")
    doc = {"burst_onset_s": BURST_ONSET_S, "model": args.model, "cells": cells}
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=2) + "\n")
    if args.html_path:
        xs = sorted({round(c["copy_to_onset"], 4) for c in cells})
        figs = []
        for key in ("predictive_gain_p99", "oracle_gain_p99", "predictive_gain_mean"):
            z = [[next((100 * c[key] for c in cells if c["load"] == ld
                        and round(c["copy_to_onset"], 4) == x), None) for x in xs] for ld in loads]
            fig = go.Figure(go.Heatmap(x=[f"{x:.3f}" for x in xs], y=loads, z=z, colorbar={"title": "%"}))
            fig.update_layout(title=f"{key} over reactive (%)", xaxis_title="copy time / burst onset",
                              yaxis_title="load")
            figs.append(fig.to_html(full_html=False, include_plotlyjs=False))
        Path(args.html_path).write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><script>{get_plotlyjs()}</script>"
            "</head><body><h1>Where speculation pays</h1>" + "".join(figs) + "</body></html>")
    return 0
