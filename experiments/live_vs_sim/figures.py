"""The live-vs-sim study's arithmetic, pure: one pass's TTFT figures from its served log, the
paired differences of predictive against reactive over passes, and the direction they show.

A *pass* is one replay of the headline scale-out cell through the real control plane and agents
under one strategy; pass pair ``k`` replays seed ``k`` once under each strategy, so the two
passes of a pair serve the same requests and differ only by the strategy (and the live
system's timing). The simulator's figures for the same seeds are paired the same way.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from controlplane.core import stats

WARMUP_S = 300.0  # trace seconds left out of every figure: the grid's --warmup (the cold start)
AHEAD, BEHIND, UNRESOLVED = "predictive ahead", "reactive ahead", "not resolved"


def read_served(path: Path) -> list[tuple[float, float]]:
    """(trace seconds, TTFT seconds) of every request a pass served (``--served-log``)."""
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        if rows.fieldnames is None or not {"t_s", "ttft_s"} <= set(rows.fieldnames):
            raise ValueError(f"{path}: not a served log (want columns t_s, ttft_s)")
        return [(float(r["t_s"]), float(r["ttft_s"])) for r in rows]


def pass_figures(served: Iterable[tuple[float, float]], warmup_s: float = WARMUP_S) -> dict:
    """Requests, mean and p99 TTFT of the requests that arrived at or after ``warmup_s`` (the
    simulator's rule, ``sim.metrics.summarize``: numpy's linear percentile)."""
    ttft = np.array([x for t, x in served if t >= warmup_s], dtype=np.float64)
    if not len(ttft):
        raise ValueError(f"no request after the {warmup_s:g} s warm-up: nothing to measure")
    return {
        "requests": int(len(ttft)),
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
    }


def direction(interval: stats.Interval | None, diffs: Sequence[float]) -> str:
    """What per-pair gains of predictive over reactive say: ahead or behind when their 95%
    interval excludes zero; with one pair (no interval) its sign, marked as one pair."""
    if interval is None:
        if len(diffs) != 1 or diffs[0] == 0:
            return UNRESOLVED
        return (AHEAD if diffs[0] > 0 else BEHIND) + " (one pair, no interval)"
    if interval.low > 0:
        return AHEAD
    if interval.high < 0:
        return BEHIND
    return UNRESOLVED


def paired_gain(reactive: Sequence[float], predictive: Sequence[float]) -> dict:
    """Per pair ``reactive - predictive`` (positive: predictive lower, i.e. better) and the
    relative gain ``(reactive - predictive) / reactive``; their means with 95% Student t
    intervals on ``df`` = pairs - 1 degrees of freedom (``core.stats``; with 2 pairs t is 12.7,
    not the normal 1.96) and the direction the gains show (the headline's rule, ``sim.seeds.
    gain_stats``: one seed's tail in seconds can be ten times another's)."""
    if len(reactive) != len(predictive) or not reactive:
        raise ValueError("need the same, non-zero number of passes per strategy")
    diffs = [r - p for r, p in zip(reactive, predictive, strict=True)]
    gains = [(r - p) / r if r > 0 else 0.0 for r, p in zip(reactive, predictive, strict=True)]
    ci = stats.paired(reactive, predictive)
    gi = stats.mean_interval(gains)
    return {
        "pairs": len(diffs),
        "diff_s": diffs,
        "diff_mean_s": sum(diffs) / len(diffs),
        "diff_ci95_s": None if ci is None else [ci.low, ci.high],
        "gain": gains,
        "gain_mean": sum(gains) / len(gains),
        "gain_ci95": None if gi is None else [gi.low, gi.high],
        "df": None if gi is None else gi.df,
        "direction": direction(gi, gains),
    }


def compare(passes: list[dict], stat: str = "ttft_p99_s") -> dict:
    """Pair live passes by seed (one pass per strategy per seed; a seed missing either side is
    left out) and compute ``paired_gain`` of ``stat``."""
    by: dict[int, dict[str, float]] = {}
    for p in passes:
        if p["strategy"] not in ("reactive", "predictive"):
            raise ValueError(f"pass of strategy {p['strategy']!r}: want reactive or predictive")
        side = by.setdefault(p["seed"], {})
        if p["strategy"] in side:
            raise ValueError(f"seed {p['seed']}: two {p['strategy']} passes")
        side[p["strategy"]] = p["figures"][stat]
    seeds = sorted(s for s, v in by.items() if len(v) == 2)
    if not seeds:
        raise ValueError("no seed with both a reactive and a predictive pass")
    out = paired_gain([by[s]["reactive"] for s in seeds], [by[s]["predictive"] for s in seeds])
    return {"seeds": seeds, **out}


def agreement(live: str, sim: str) -> str:
    """Whether the live direction reproduces the simulator's: ``same`` (both resolved, equal),
    ``opposite`` (both resolved, different), ``live unresolved`` otherwise."""
    base = lambda d: d.split(" (")[0]  # noqa: E731 (the one-pair mark is not a direction)
    lv, sv = base(live), base(sim)
    if lv == UNRESOLVED or sv == UNRESOLVED:
        return "live unresolved" if lv == UNRESOLVED else "simulator unresolved"
    return "same" if lv == sv else "opposite"


def copy_timing(landings: Iterable[tuple[int, float]], joins: dict[int, float]) -> dict:
    """When copies landed, from (engine index, trace seconds) per landed copy: how many, the
    first, and how many reached a joining engine (``joins``: engine -> trace second it starts
    serving) before it served, the copies that pay in a scale-out."""
    xs = sorted(landings, key=lambda x: x[1])
    early = [e for e, t in xs if e in joins and t <= joins[e]]
    return {
        "landed": len(xs),
        "first_landed_s": round(xs[0][1], 1) if xs else None,
        "on_joining_engines": sum(1 for e, _ in xs if e in joins),
        "on_joining_before_serving": len(early),
    }
