"""Benchmark: burst statistics of the ServeGen m-large tenants and how `burst_risk` calibrates.

Bursts: a window is in a burst when its rate exceeds BURST_FACTOR (2x) the tenant's usual rate (its median
10-minute rate over the 14 days; a tenant idle most of the time uses its mean instead).
Calibration: at every window w with traffic, `burst_risk` predicts from w's rate and
inter-arrival CV (measured over w, so `window_s` = 600) whether the next window's arrivals exceed
a capacity; the observed outcome is the next window's real count. Two capacities: 2x the usual
rate (a burst), and 1.5x the current rate (headroom over what the holders see now). Baseline in
the same run: the same formula with CV = 1 (Poisson arrivals), and persistence (certain overload
if the current rate already exceeds the capacity). Reliability by bins of predicted probability
and Brier scores. Note the renewal model knows nothing of rate changes between windows.

    python bench/burst_risk.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.core.demand import BURST_FACTOR  # noqa: E402
from controlplane.core.forecast.burst import burst_risk  # noqa: E402
from controlplane.core.traces.servegen import load_servegen_windows  # noqa: E402

BINS = [0.0, 0.05, 0.2, 0.4, 0.6, 0.8, 0.95, 1.0001]


def usual_rate(rate: np.ndarray) -> float:
    med = float(np.median(rate))
    return med if med > 0 else float(rate.mean())


def burst_stats(tenants) -> dict:
    volume = burst_volume = high_cv_volume = 0.0
    runs: list[int] = []
    for t in tenants.values():
        counts = t.expected_counts()
        burst = t.rate > BURST_FACTOR * usual_rate(t.rate)
        volume += counts.sum()
        burst_volume += counts[burst].sum()
        high_cv_volume += counts[t.cv > 4].sum()
        edges = np.diff(np.concatenate(([0], burst.astype(int), [0])))
        runs += list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
    runs_arr = np.array(runs) * 10
    return {
        "burst_volume_share": burst_volume / volume,
        "cv_over_4_volume_share": high_cv_volume / volume,
        "burst_episodes": len(runs),
        "burst_minutes_mean": float(runs_arr.mean()),
        "burst_minutes_volume_weighted": float((runs_arr**2).sum() / runs_arr.sum()),
    }


def calibration(tenants, capacity: str) -> dict:
    preds: dict[str, list[float]] = {"model": [], "poisson": [], "persistence": []}
    outcomes: list[bool] = []
    for t in tenants.values():
        usual = usual_rate(t.rate)
        for w in np.flatnonzero(t.rate[:-1] > 0):
            rate, cv = float(t.rate[w]), float(t.cv[w])
            cap = BURST_FACTOR * usual if capacity == "2x_usual" else 1.5 * rate
            for name, c in (("model", cv), ("poisson", 1.0)):
                preds[name].append(
                    burst_risk(
                        recent_rate=rate,
                        interarrival_cv=c,
                        capacity_rate=cap,
                        horizon_s=600,
                        window_s=600,
                    )
                )
            preds["persistence"].append(float(rate > cap))
            outcomes.append(np.floor(t.rate[w + 1] * 600) > np.floor(cap * 600))
    y = np.array(outcomes, dtype=float)
    p = np.array(preds["model"])
    table = []
    for lo, hi in zip(BINS[:-1], BINS[1:], strict=True):
        sel = (p >= lo) & (p < hi)
        if sel.any():
            row = dict(bin=f"[{lo:.2f},{min(hi, 1):.2f})", n=int(sel.sum()))
            row |= dict(predicted=float(p[sel].mean()), observed=float(y[sel].mean()))
            table.append(row)
    brier = {name: float(np.mean((np.array(v) - y) ** 2)) for name, v in preds.items()}
    brier["base_rate"] = float(np.mean((y.mean() - y) ** 2))
    return {"windows": len(y), "observed_rate": float(y.mean()), "brier": brier, "bins": table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="first 30 tenants only")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    tenants = load_servegen_windows()
    if args.quick:
        tenants = dict(list(tenants.items())[:30])
    out = {"tenants": len(tenants), "bursts": burst_stats(tenants), "calibration": {}}
    for capacity in ("2x_usual", "1.5x_current"):
        out["calibration"][capacity] = calibration(tenants, capacity)
    n = 20_000
    t0 = time.perf_counter()
    for i in range(n):
        burst_risk(recent_rate=1 + i % 7, interarrival_cv=2.0, capacity_rate=6, horizon_s=60)
    out["burst_risk_us_per_call"] = (time.perf_counter() - t0) / n * 1e6

    b = out["bursts"]
    print(f"ServeGen m-large, {len(tenants)} tenants")
    print(
        f"volume in bursts (> 2x usual rate): {b['burst_volume_share']:.1%}; "
        f"episodes {b['burst_episodes']}, mean {b['burst_minutes_mean']:.0f} min "
        f"(volume-weighted {b['burst_minutes_volume_weighted']:.0f} min)"
    )
    print(f"volume in windows with inter-arrival CV > 4: {b['cv_over_4_volume_share']:.1%}")
    print(f"burst_risk: {out['burst_risk_us_per_call']:.1f} us per call")
    for capacity, c in out["calibration"].items():
        print(
            f"\ncapacity {capacity}: {c['windows']} windows, overload rate {c['observed_rate']:.3f}"
        )
        print("  Brier: " + ", ".join(f"{k} {v:.4f}" for k, v in c["brier"].items()))
        print(f"  {'bin':<14}{'n':>8}{'predicted':>11}{'observed':>10}")
        for row in c["bins"]:
            print(
                f"  {row['bin']:<14}{row['n']:>8}{row['predicted']:>11.3f}{row['observed']:>10.3f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
