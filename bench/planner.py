"""One plan for 256 engines x 100k prefixes (target < 1 s).

Synthetic but shaped like a fleet: Zipf(1.1) demand over 100k prefixes, one to three holders
each, engines at 20-90% load. Baseline in the same run: a plan over 10k prefixes.

    python bench/planner.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from controlplane.core.planner import Budgets, Candidate, Demand, EngineState, Holding, plan

TARGET_S = 1.0


def inputs(n_prefix: int, n_engine: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    engines = [
        EngineState(
            f"e{i}",
            f"n{i // 8}",
            130e9,
            float(rng.uniform(5e9, 60e9)),
            0.0,
            12.5e9,
            float(rng.uniform(0.2, 0.9)),
        )
        for i in range(n_engine)
    ]
    tokens = rng.integers(16, 256, size=n_prefix) * 512
    rate = 1.0 / np.arange(1, n_prefix + 1) ** 1.1 * 400.0
    cands, demand, holds = [], [], []
    for p in range(n_prefix):
        pid = str(p)
        t = int(tokens[p])
        cands.append(Candidate(pid, (p,), t, t * 327_680, "k", 0.15, t * 1e-4))
        demand.append(Demand(pid, float(rate[p] * 120), 0.3, float(rate[p] * 2), 0.8))
        for h in rng.choice(n_engine, size=int(rng.integers(1, 4)), replace=False):
            holds.append(Holding(pid, f"e{h}"))
    return cands, demand, holds, engines


def timed(n_prefix: int, n_engine: int, repeats: int) -> tuple[float, int]:
    c, d, h, e = inputs(n_prefix, n_engine)
    best, items = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = plan(c, d, h, e, Budgets(horizon_s=120.0, max_spec_vram_fraction=0.25))
        best = min(best, time.perf_counter() - t0)
        items = len(out)
    return best, items


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    big, items = timed(100_000, 256, repeats)
    small, small_items = timed(10_000, 256, repeats)
    print(f"{'plan':<28}{'seconds':>10}{'items':>8}")
    print(f"{'256 engines x 100k prefixes':<28}{big:>10.3f}{items:>8}")
    print(f"{'256 engines x 10k (base)':<28}{small:>10.3f}{small_items:>8}")
    print(f"target < {TARGET_S} s: {'met' if big < TARGET_S else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "plan_seconds": big,
                    "items": items,
                    "plan_seconds_10k": small,
                    "target_s": TARGET_S,
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
