"""The RSS of every process of a ``bench/demo_memory.py`` run over time, one panel a mode; or,
given the probe's JSON lines (``probe/*.jsonl``), where the web process's memory was.

    .venv/bin/python experiments/demo-memory/figure.py bench/results/demo_memory.json OUT.svg
    .venv/bin/python experiments/demo-memory/figure.py probe/default-trims.jsonl OUT.svg

Agents are drawn thin and grey (six of them, alike); the shaded span is the window the verdict's
slope is taken over (the last 30 minutes, or the second half of a shorter run); the 1-minute
load average runs along the bottom of each panel, on its own axis.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: Path, out: Path, window_min: float = 30.0) -> None:
    runs = json.loads(src.read_text())
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.8), squeeze=False)
    for ax, (mode, run) in zip(axes[0], runs.items(), strict=True):
        rows = run["samples"]
        minutes = [r["t_s"] / 60 for r in rows]
        names = sorted({k for r in rows for k in r["rss_kb"]})
        for name in names:
            ys = [r["rss_kb"].get(name, float("nan")) / 1024 for r in rows]
            agent = name.startswith("agent")
            slope = run["slope_mb_per_min"].get(name)
            label = (
                None if agent else f"{name} ({slope:+.2f} MB/min)" if slope is not None else name
            )
            ax.plot(minutes, ys, lw=0.7 if agent else 1.6, color="0.6" if agent else None,
                    label=label)  # fmt: skip
        ax.plot([], [], lw=0.7, color="0.6", label="agents (6)")
        end = minutes[-1] if minutes else 0
        start = end - window_min if end >= 2 * window_min else end / 2
        ax.axvspan(start, end, color="0.93", zorder=0)
        ax.set(title=mode, xlabel="minutes after the demo said it was running", ylabel="RSS (MB)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper left")
        load = ax.twinx()
        load.plot(minutes, [r["load_1m"] for r in rows], color="tab:red", lw=0.6, ls=":")
        load.set_ylabel("load average, 1 min (dotted)", color="tab:red", fontsize=8)
        load.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out)


def probe(src: Path, out: Path) -> None:
    rows = [json.loads(line) for line in src.read_text().splitlines() if line]
    minutes = [r["t"] / 60 for r in rows]
    mib = 2**20
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series = {
        "RSS": [r["VmRSS"] / 1024 for r in rows],
        "allocator: in use (uordblks)": [r["uord"] / mib for r in rows],
        "allocator: free, kept (fordblks)": [r["ford"] / mib for r in rows],
        "tracemalloc: traced": [(r["traced"] or 0) / mib for r in rows],
    }
    for name, ys in series.items():
        ax.plot(minutes, ys, lw=1.6 if name == "RSS" else 1.0, label=name)
    for r in rows:
        if r["tag"] == "after_trim":
            ax.axvline(r["t"] / 60, color="0.5", ls="--", lw=0.8)
            ax.annotate("malloc_trim(0)", (r["t"] / 60, r["VmRSS"] / 1024), fontsize=7)
    ax.set(title=f"web process ({src.stem})", xlabel="minutes after daphne started", ylabel="MB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    (probe if src.suffix == ".jsonl" else main)(src, dst)
