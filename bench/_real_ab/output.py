"""bench/real_ab.py's output: the terminal table, the docs' markdown table, the plotly chart of
TTFT over time and the JSON document."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from _common import table

from _real_ab.figures import POLICIES, gpu_ratio, report
from wire.protocol import JOB_FAILED


def print_table(summary: dict) -> str:
    rows = []
    for p, s in summary["policies"].items():
        rows.append(
            (
                p,
                str(s["runs"]),
                f"{1000 * s['ttft_mean_s']:.1f}",
                f"{1000 * s['ttft_p50_s']:.1f}",
                f"{1000 * s['ttft_p99_s']:.1f}",
                f"{1000 * s['joiner_first_2min_mean_s']:.1f}",
                f"{s['hit_rate']:.3f}",
                f"{s['cached_token_share']:.3f}",
                f"{s['warmups']:.1f}",
                f"{s['warmups_landed']:.1f}",
                f"{1000 * s['warmup_cost_s']:.0f}",
            )
        )
    text = table(
        rows,
        (
            "policy",
            "runs",
            "TTFT mean ms",
            "p50 ms",
            "p99 ms",
            "joiner 2min mean ms",
            "hit rate",
            "cached share",
            "warm-ups sent",
            "landed (KV events)",
            "warm-up cost ms",
        ),
    )
    notes = [f"  {p}: {n}" for p, s in summary["policies"].items() for n in s.get("notes", [])]
    lines = [
        text,
        *notes,
        "",
        "paired differences vs none (policy - none; mean +- 95% CI half-width):",
    ]
    for p, ks in summary["paired_vs_none"].items():
        parts = []
        for k, d in ks.items():
            if d["mean"] is None:
                continue
            scale = 1 if k == "hit_rate" else 1000
            ci = f" +- {scale * d['ci95']:.2f}" if d["ci95"] is not None else ""
            parts.append(f"{k} {scale * d['mean']:+.2f}{ci}")
        lines.append(f"  {p}: " + "; ".join(parts) + " (ms; hit rate as a fraction)")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    """The docs table: per policy, and the paired differences with their 95% intervals."""
    sm = doc["summary"]
    lines = [
        "| policy | runs | TTFT mean (ms) | p50 | p99 | joining engine, first 2 min: mean | "
        "p99 | hit rate | cached-token share | warm-ups sent | landed | failed "
        "| warm-up prefill (ms) | client TTFT mean (ms) | p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in POLICIES:
        s = sm["policies"].get(p)
        if not s:
            continue
        rs = [r for r in doc["runs"] if r["policy"] == p]
        failed = statistics.fmean(r["warmups_by_state"].get(JOB_FAILED, 0) for r in rs)
        lines.append(
            f"| {p} | {s['runs']} | {1000 * s['ttft_mean_s']:.1f} | {1000 * s['ttft_p50_s']:.1f} "
            f"| {1000 * s['ttft_p99_s']:.1f} | {1000 * s['joiner_first_2min_mean_s']:.1f} "
            f"| {1000 * s['joiner_first_2min_p99_s']:.1f} | {s['hit_rate']:.3f} "
            f"| {s['cached_token_share']:.3f} | {s['warmups']:.1f} "
            f"| {s.get('warmups_landed', float('nan')):.1f} | {failed:.1f} "
            f"| {1000 * s['warmup_cost_s']:.0f} "
            f"| {1000 * s.get('client_ttft_mean_s', float('nan')):.1f} "
            f"| {1000 * s.get('client_ttft_p99_s', float('nan')):.1f} |"
        )
    notes = [f"- {p}: {n}" for p in POLICIES for n in sm["policies"].get(p, {}).get("notes", [])]
    if notes:
        lines += ["", *notes]
    lines += [
        "",
        "| paired difference (run i vs run i) | TTFT mean (ms) | p50 | p99 | "
        "joining engine, first 2 min mean | hit rate |",
        "|---|---|---|---|---|---|",
    ]
    pairs = dict(sm.get("paired_vs_none", {}))
    rows = [(f"{p} - none", d) for p, d in pairs.items()]
    if sm.get("paired_predictive_vs_reactive"):
        rows.append(("predictive - reactive", sm["paired_predictive_vs_reactive"]))
    for name, d in rows:
        cells = []
        for k in ("ttft.mean", "ttft.p50", "ttft.p99", "joiner_first_2min.mean", "hit_rate"):
            x = d.get(k)
            if not x or x["mean"] is None:
                cells.append("")
                continue
            scale, fmt = (1, ".3f") if k == "hit_rate" else (1000, ".1f")
            ci = f" ± {scale * x['ci95']:{fmt}}" if x["ci95"] is not None else ""
            cells.append(f"{scale * x['mean']:+{fmt}}{ci}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_html(path: Path, runs: list[dict], title: str, cdn: bool = False) -> None:
    """TTFT over time per policy: every request of every run (points; the joining engine's in
    a second trace per policy) and the mean per 10-second bin (lines), times from each run's
    start. Self-contained (plotly.js inside, ~4.7 MB) unless ``cdn``: then a small file that
    loads plotly.js from its CDN when opened (the one committed under docs/)."""
    import plotly.graph_objects as go

    colours = {"none": "#7f7f7f", "reactive": "#1f77b4", "predictive": "#d62728"}
    fig = go.Figure()
    for p in POLICIES:
        rs = [r for r in runs if r["policy"] == p]
        for joiner in (False, True):
            xs, ys = [], []
            for r in rs:
                for t, ttft, eng in r["timeline"]:
                    if eng.endswith("vllm-b") == joiner:
                        xs.append(round(t, 1))
                        ys.append(round(1000 * ttft, 1))
            if xs:
                fig.add_trace(
                    go.Scattergl(
                        x=xs,
                        y=ys,
                        mode="markers",
                        name=f"{p} ({'joining engine' if joiner else 'first engine'})",
                        marker={
                            "color": colours[p],
                            "size": 4,
                            "symbol": "diamond" if joiner else "circle",
                            "opacity": 0.6,
                        },
                    )
                )
        bins: dict[int, list[float]] = {}
        for r in rs:
            for t, ttft, _ in r["timeline"]:
                bins.setdefault(int(t // 10), []).append(1000 * ttft)
        if bins:
            keys = sorted(bins)
            fig.add_trace(
                go.Scatter(
                    x=[10 * k + 5 for k in keys],
                    y=[round(statistics.fmean(bins[k]), 1) for k in keys],
                    mode="lines",
                    name=f"{p}: mean per 10 s",
                    line={"color": colours[p], "width": 3},
                )
            )
    serve = [r["serving_at_s"] for r in runs if r.get("serving_at_s") is not None]
    if serve:
        fig.add_vline(x=statistics.median(serve), line_dash="dash", annotation_text="vllm-b serves")
    fig.update_layout(
        title=title,
        xaxis_title="seconds since the run started",
        yaxis_title="TTFT (ms)",
        yaxis_type="log",
        template="plotly_white",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs="cdn" if cdn else True, full_html=True)


def build_doc(runs, args, requests, probe_figures, load_before, t0) -> dict:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {
        "bench": "real_ab",
        "quick": args.quick,
        "settings": {
            k: getattr(args, k)
            for k in ("runs", "announce_s", "serve_s", "serving_s", "rate", "tenants")
        },
        "runs_done": len(runs),
        "requests_per_run_replayed": len(requests),
        "prefill_probe": probe_figures,
        "gpu_cost_model": gpu_ratio(requests),
        "load_avg_before": load_before,
        "uptime_after": uptime,
        "wall_s": time.monotonic() - t0,
        "summary": report(runs, probe_figures["cold_ttft_s"], probe_figures["prompt_tokens"]),
        "runs": runs,
    }
