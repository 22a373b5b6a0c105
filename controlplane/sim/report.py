"""Reports: the console table, the JSON document and the offline Plotly HTML."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

COLUMNS = [
    ("requests", "reqs", "{:d}"),
    ("ttft_mean_s", "mean s", "{:.3f}"),
    ("ttft_p50_s", "p50 s", "{:.3f}"),
    ("ttft_p90_s", "p90 s", "{:.3f}"),
    ("ttft_p99_s", "p99 s", "{:.3f}"),
    ("hit_rate_tokens", "hit", "{:.3f}"),
    ("bytes_moved", "GB moved", None),
    ("spec_vram_fraction_mean", "spec VRAM", "{:.4f}"),
    ("replica_precision", "precision", "{:.2f}"),
    ("value_ratio", "value m/m", "{:.3f}"),  # measured / modelled (``sim.valued``)
    ("wall_s", "wall s", "{:.1f}"),
]


def table(doc: dict) -> str:
    head = f"{'policy':<13}" + "".join(f"{label:>11}" for _, label, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for name, m in doc["policies"].items():
        cells = []
        for key, _, fmt in COLUMNS:
            v = m.get(key)
            if key == "bytes_moved":
                cells.append(f"{v / 1e9:>11.1f}")
            elif v is None:
                cells.append(f"{'-':>11}")
            else:
                cells.append(f"{(fmt or '{}').format(v):>11}")
        lines.append(f"{name:<13}" + "".join(cells))
    return "\n".join(lines)


def write_json(doc: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def write_html(doc: dict, results: dict, workload, path: str | Path) -> None:
    figs = [
        _cdf(results),
        _over_time(results, workload),
        _vram(results),
        _forecast(results, workload),
    ]
    parts = [fig.to_html(full_html=False, include_plotlyjs=False) for fig in figs]
    rows = table(doc).replace("&", "&amp;").replace("<", "&lt;")
    assumptions = "".join(f"<li><b>{k}</b>: {v}</li>" for k, v in doc["assumptions"].items())
    html = (
        "<!doctype html><html><head><meta charset='utf-8'><title>prewarm-sim report</title>"
        f"<script>{get_plotlyjs()}</script></head><body style='font-family:sans-serif'>"
        f"<h1>prewarm-sim: {doc['workload']} / {doc['cluster']['scenario']}</h1>"
        f"<pre>{rows}</pre><h2>Assumptions</h2><ul>{assumptions}</ul>"
        + "".join(parts)
        + "</body></html>"
    )
    Path(path).write_text(html)


def _cdf(results) -> go.Figure:
    fig = go.Figure()
    for name, r in results.items():
        x = np.sort(r.ttft)
        step = max(1, len(x) // 2000)
        fig.add_trace(
            go.Scatter(x=x[::step], y=np.arange(1, len(x) + 1)[::step] / len(x), name=name)
        )
    fig.update_layout(
        title="TTFT CDF", xaxis_title="TTFT (s)", xaxis_type="log", yaxis_title="fraction"
    )
    return fig


def _over_time(results, workload) -> go.Figure:
    fig = go.Figure()
    dur = max(workload.duration_s, 1.0)
    bins = np.linspace(0, dur, 121)
    counts, _ = np.histogram(workload.t, bins=bins)
    for name, r in results.items():
        s, _ = np.histogram(workload.t, bins=bins, weights=r.ttft)
        fig.add_trace(go.Scatter(x=bins[:-1], y=s / np.maximum(counts, 1), name=name))
    # Bursts: bins whose arrival rate is over twice the median bin.
    med = np.median(counts[counts > 0]) if (counts > 0).any() else 0
    for b in np.nonzero(counts > 2 * med)[0]:
        fig.add_vrect(x0=bins[b], x1=bins[b + 1], fillcolor="orange", opacity=0.2, line_width=0)
    fig.update_layout(
        title="Mean TTFT over time (shaded: bursts, > 2x the median arrival rate)",
        xaxis_title="time (s)",
        yaxis_title="TTFT (s)",
    )
    return fig


def _vram(results) -> go.Figure:
    fig = go.Figure()
    for name, r in results.items():
        t = [s["t"] for s in r.samples]
        fig.add_trace(
            go.Scatter(x=t, y=[s["normal_bytes"] / 1e9 for s in r.samples], name=f"{name} cached")
        )
        if any(s["spec_bytes"] for s in r.samples):
            fig.add_trace(
                go.Scatter(
                    x=t, y=[s["spec_bytes"] / 1e9 for s in r.samples], name=f"{name} speculative"
                )
            )
    fig.update_layout(title="KV VRAM by kind (GB, all engines)", xaxis_title="time (s)")
    return fig


def _forecast(results, workload) -> go.Figure:
    fig = go.Figure()
    keys: dict[str, list[int]] = {}
    for p, k in enumerate(workload.prefix_wkey):
        keys.setdefault(k, []).append(p)
    counts = np.bincount(workload.pid, minlength=len(workload.prefixes))
    vol = sorted(keys, key=lambda k: -sum(counts[p] for p in keys[k]))[:3]
    bins = np.arange(0, max(workload.duration_s, 60.0) + 60, 60.0)
    for k in vol:
        sel = np.isin(workload.pid, keys[k])
        c, _ = np.histogram(workload.t[sel], bins=bins)
        fig.add_trace(go.Scatter(x=bins[:-1], y=c / 60.0, name=f"{k} actual"))
        for name, r in results.items():
            log = r.forecasts.get(k)
            if log and name == "predictive":
                fig.add_trace(
                    go.Scatter(
                        x=[a for a, _ in log],
                        y=[b for _, b in log],
                        name=f"{k} forecast",
                        mode="lines",
                        line={"dash": "dash"},
                    )
                )
    fig.update_layout(
        title="Forecast vs actual demand, busiest keys (requests/s)", xaxis_title="time (s)"
    )
    return fig
