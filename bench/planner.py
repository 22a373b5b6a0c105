"""One plan at fleet scale: 1,000 engines x 10,000 prefixes with multi-block chains and
realistic overflow (target < 2 s); and the older 256 engines x 100k one-block prefixes (< 1 s).

Fleet case: 1,000 engines on 125 nodes of 8, 20-90% load, 5-60 GB free; 10,000 prefixes of
4-128 blocks (2k-64k tokens, 16 tokens and 5 MiB per block: chains of distinct keys), Zipf(0.9)
demand scaled so that about a fifth of the prefixes overflow their one to three holders, many by
several engines' worth (every such prefix wants more than one replica), burst probabilities
0-0.6. Baseline in the same run: plain numpy over the same inputs (the overflow of every prefix
computed as arrays: what the planner must at least look at), as a ratio.

    python bench/planner.py [--quick] [--json PATH] [--profile PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

from controlplane.core.policy import knobs
from controlplane.core.policy.planner import plan
from controlplane.core.policy.types import Budgets, Candidate, Demand, EngineState, Holding
from controlplane.sim.planned import SIMULATED

# The planner's search timed uncharged and without a transfer budget (the bench's setting since
# before the charges: items are planned on benefit alone), with the simulator's VRAM slice.
BUDGETS = Budgets(
    horizon_s=120.0,
    ttl_s=600.0,
    max_spec_vram_fraction=SIMULATED["max_spec_vram_fraction"],
    max_bytes_per_interval=float(knobs.MAX_BYTES_PER_INTERVAL.high),
    min_benefit_ratio=1.0,
    max_queue_s=math.inf,
    max_cluster_queue_s=math.inf,
)
TARGET_S = 1.0
FLEET_TARGET_S = 2.0
BLOCK_BYTES = 5 << 20


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


def fleet_inputs(n_prefix: int = 10_000, n_engine: int = 1_000, seed: int = 0):
    """The fleet case (module docstring)."""
    rng = np.random.default_rng(seed)
    loads = rng.uniform(0.2, 0.9, n_engine)
    engines = [
        EngineState(
            f"e{i}",
            f"n{i // 8}",
            130e9,
            float(rng.uniform(5e9, 60e9)),
            0.0,
            float(rng.choice([12.5e9, 25e9, 50e9])),
            float(loads[i]),
        )
        for i in range(n_engine)
    ]
    blocks = rng.integers(4, 129, size=n_prefix)
    service = 0.05 + blocks * 16 * 2e-6
    recompute = blocks * 16 * 1e-4
    rate = 1.0 / np.arange(1, n_prefix + 1) ** 0.9
    rate = rate / rate[n_prefix // 5] * 1.0 / service  # the 2,000th prefix: ~1 engine's worth
    burst = rng.uniform(0, 0.6, n_prefix)
    cands, demand, holds = [], [], []
    next_key = 1
    holders = []
    for p in range(n_prefix):
        pid = f"p{p}"
        nb = int(blocks[p])
        keys = tuple(range(next_key, next_key + nb))
        next_key += nb
        t = nb * 16
        cands.append(
            Candidate(pid, keys, t, nb * BLOCK_BYTES, f"k{p % 500}", service[p], recompute[p])
        )
        demand.append(Demand(pid, float(rate[p] * 120), float(burst[p]), float(rate[p] * 2), 0.8))
        hs = rng.choice(n_engine, size=int(rng.integers(1, 4)), replace=False)
        holders.append(hs)
        for h in hs:
            holds.append(Holding(pid, f"e{h}"))
    # Overflow as arrays: the plain numpy baseline over the same inputs.
    spare = 1.0 - loads
    return cands, demand, holds, engines, (rate, burst, service, holders, spare)


def numpy_baseline(arrays) -> tuple[float, int]:
    """Every prefix's overflow over its holders' spare capacity, as arrays."""
    rate, burst, service, holders, spare = arrays
    t0 = time.perf_counter()
    h = np.zeros((len(holders), 3), dtype=np.int64)
    m = np.zeros((len(holders), 3), dtype=bool)
    for i, hs in enumerate(holders):
        h[i, : len(hs)] = hs
        m[i, : len(hs)] = True
    cap = (spare[h] * m).sum(axis=1) / service * 0.8
    lam = rate + burst * np.maximum(0.0, rate * 2 - rate)
    overflow = lam - cap
    n = int((overflow > 0).sum())
    return time.perf_counter() - t0, n


def timed(n_prefix: int, n_engine: int, repeats: int, fleet: bool = False) -> tuple[float, int]:
    if fleet:
        c, d, h, e, _ = fleet_inputs(n_prefix, n_engine)
    else:
        c, d, h, e = inputs(n_prefix, n_engine)
    best, items = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = plan(c, d, h, e, BUDGETS)
        best = min(best, time.perf_counter() - t0)
        items = len(out)
    return best, items


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--profile", help="cProfile the fleet plan into this file")
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    load0 = os.getloadavg()[0]
    fc, fd, fh, fe, arrays = fleet_inputs()
    overflowing = numpy_baseline(arrays)[1]
    base_s = min(numpy_baseline(arrays)[0] for _ in range(repeats))
    if args.profile:
        import cProfile

        cProfile.runctx(
            "plan(fc, fd, fh, fe, BUDGETS)",
            globals(),
            {"fc": fc, "fd": fd, "fh": fh, "fe": fe},
            args.profile,
        )
    fleet, fleet_items = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = plan(fc, fd, fh, fe, BUDGETS)
        fleet = min(fleet, time.perf_counter() - t0)
        fleet_items = len(out)
    big, items = timed(100_000, 256, repeats)
    small, small_items = timed(10_000, 256, repeats)
    chains = [len(c.keys) for c in fc]
    print(f"{'plan':<44}{'seconds':>10}{'items':>8}")
    print(f"{'1,000 engines x 10k prefixes (fleet)':<44}{fleet:>10.3f}{fleet_items:>8}")
    print(f"{'  baseline: numpy overflow, same inputs':<44}{base_s:>10.4f}{'-':>8}")
    print(f"{'256 engines x 100k one-block prefixes':<44}{big:>10.3f}{items:>8}")
    print(f"{'256 engines x 10k (base)':<44}{small:>10.3f}{small_items:>8}")
    print(
        f"fleet: chains of {min(chains)}-{max(chains)} blocks (mean {np.mean(chains):.0f}), "
        f"{overflowing:,} prefixes overflow their holders; plan / numpy = {fleet / base_s:,.0f}x"
    )
    print(
        f"target fleet < {FLEET_TARGET_S} s: {'met' if fleet < FLEET_TARGET_S else 'NOT met'} "
        f"({fleet / FLEET_TARGET_S:.2f} of the limit); "
        f"256 x 100k < {TARGET_S} s: {'met' if big < TARGET_S else 'NOT met'} "
        f"({big / TARGET_S:.2f}); load average {load0:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "fleet_plan_seconds": fleet,
                    "fleet_items": fleet_items,
                    "fleet_overflowing_prefixes": overflowing,
                    "fleet_numpy_baseline_seconds": base_s,
                    "fleet_target_s": FLEET_TARGET_S,
                    "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
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
