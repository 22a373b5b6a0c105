"""Trace replay speed of the simulator with ``least-loaded`` routing (no replication).

Target: >= 100k requests/s. Baseline in the same run:
``cache-aware`` routing on the same trace (it scans every engine per request).

    python bench/sim_replay.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.scenarios import build

TARGET = 100_000


def measure(setup, name: str, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        Simulation(setup.config, setup.workload, make_policy(name)).run()
        best = max(best, len(setup.workload) / (time.perf_counter() - t0))
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    setup = build(
        workload="mooncake", engines=16, model="llama3-70b", gpu="a800", gpus_per_engine=8
    )
    repeats = 2 if args.quick else 5
    rps = measure(setup, "least-loaded", repeats)
    base = measure(setup, "cache-aware", repeats)
    print(f"{'what':<36}{'requests/s':>14}")
    print(f"{'least-loaded replay (Mooncake, 16)':<36}{rps:>14,.0f}")
    print(f"{'cache-aware replay (baseline)':<36}{base:>14,.0f}")
    print(f"target >= {TARGET:,}: {'met' if rps >= TARGET else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "requests_per_s": rps,
                    "cache_aware_requests_per_s": base,
                    "requests": len(setup.workload),
                    "target": TARGET,
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
