"""Before and after, per seed-cell: the shipped reactive and predictive as committed (BEFORE
files) and with measured demand's replicas outside the slice (AFTER files), beside the
routing-time rule, hot fanout and the ceiling (from the BEFORE files).

    python experiments/demand-room/compare.py --before A.jsonl,B.jsonl --after C.jsonl,D.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from controlplane.sim.seeds import BASELINES, gain_stats, why_left_out

HARM = 1.25  # the grid's per-seed threshold against the better baseline


def _load(paths: str) -> dict:
    out: dict = defaultdict(dict)
    for path in paths.split(","):
        for line in open(path):
            r = json.loads(line)
            for name, m in r["policies"].items():
                out[(r["cell"], r["seed"])][name] = m["ttft_p99_s"]
    return out


def _fmt(g: dict | None) -> str:
    if g is None:
        return "-"
    noise = "n/a" if g["noise"] is None else f"{100 * g['noise']:.1f}%"
    return f"{100 * g['mean']:+.1f}% ± {noise}{' *' if g['beyond_noise'] else ''}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    before, after = _load(a.before), _load(a.after)
    keys = sorted(k for k in after if {"reactive", "predictive"} <= after[k].keys())
    rows, cells = [], defaultdict(list)
    print(
        "| cell | seed | reactive before | after | predictive before | after | "
        "routing-reactive | hot-fanout | everywhere |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k in keys:
        b, n = before.get(k, {}), after[k]
        row = {
            "cell": k[0],
            "seed": k[1],
            **{f"{p}_before": b.get(p) for p in ("reactive", "predictive")},
            "reactive_after": n["reactive"],
            "predictive_after": n["predictive"],
            **{p: b.get(p) for p in (*BASELINES, "everywhere")},
        }
        run = (
            {"policies": {"everywhere": {"ttft_p99_s": b["everywhere"]}}}
            if "everywhere" in b
            else {"policies": {}}
        )
        row["left_out"] = why_left_out(run)
        rows.append(row)
        cells[k[0]].append(row)
        f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        print(
            f"| {k[0].split(':', 1)[1]} | {k[1]} | {f(row['reactive_before'])} | {f(n['reactive'])} | "
            f"{f(row['predictive_before'])} | {f(n['predictive'])} | {f(row['routing-reactive'])} | "
            f"{f(row['hot-fanout'])} | {f(row['everywhere'])} |"
        )
    print()
    summary = {}
    for cell, rs in cells.items():
        kept = [r for r in rs if r["left_out"] is None]
        s: dict = {
            "seeds": [r["seed"] for r in kept],
            "left_out": [r["seed"] for r in rs if r["left_out"]],
        }
        for when in ("before", "after"):
            both = [
                r
                for r in kept
                if r[f"reactive_{when}"] is not None and r[f"predictive_{when}"] is not None
            ]
            if both:
                s[f"p_over_r_{when}"] = gain_stats(
                    [r[f"reactive_{when}"] for r in both], [r[f"predictive_{when}"] for r in both]
                )
                s[f"worst_p_over_r_{when}"] = max(
                    r[f"predictive_{when}"] / r[f"reactive_{when}"] for r in both
                )
            for pol in ("reactive", "predictive"):
                flagged = []
                for r in kept:
                    base = [r[x] for x in BASELINES if r.get(x) is not None]
                    if base and r[f"{pol}_{when}"] is not None:
                        ratio = r[f"{pol}_{when}"] / min(base)
                        if ratio > HARM:
                            flagged.append((r["seed"], round(ratio, 2)))
                s[f"{pol}_over_{HARM}x_better_baseline_{when}"] = flagged
        for pol in ("reactive", "predictive"):
            both = [r for r in kept if r[f"{pol}_before"] is not None]
            if both:
                s[f"{pol}_after_over_before"] = gain_stats(
                    [r[f"{pol}_before"] for r in both], [r[f"{pol}_after"] for r in both]
                )
        summary[cell] = s
        print(f"## {cell}: seeds {s['seeds']} (left out {s['left_out']})")
        for when in ("before", "after"):
            print(
                f"- predictive over reactive, {when}: {_fmt(s.get(f'p_over_r_{when}'))}, "
                f"worst {s.get(f'worst_p_over_r_{when}', 0):.2f}x"
            )
        for pol in ("reactive", "predictive"):
            print(
                f"- {pol} after over before: {_fmt(s.get(f'{pol}_after_over_before'))}; "
                f"> {HARM}x better baseline before {s[f'{pol}_over_{HARM}x_better_baseline_before']}, "
                f"after {s[f'{pol}_over_{HARM}x_better_baseline_after']}"
            )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "cells": summary}, fh, indent=1)


if __name__ == "__main__":
    main()
