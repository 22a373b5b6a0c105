"""The 70B headline's seeds with a larger speculative slice: the engines' slice
(``ClusterConfig.spec_fraction``) and the planner's budget (``max_spec_vram_fraction``) both
set to FRACTION instead of the simulator's 0.25, for ``reactive`` and ``predictive``; one JSON
line per seed-cell appended to OUT (seed-cells already there are skipped).

    PYTHONPATH=. python experiments/headline-20-seeds/spec_slice.py 0.4 OUT.jsonl [SEEDS [HALF]]
    # HALF: all (default), tune or holdout (``--clients``)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from controlplane.sim import planned
from controlplane.sim.grid import job_for, parse_cells
from controlplane.sim.seeds import run_one

CELLS = ("servegen:llama3-70b:scaleout", "servegen:llama3-70b:slowlink")


class Args:
    policies = ["reactive", "predictive"]
    duration = 1200.0
    warmup = 300.0
    trace_dir = None
    clients = "all"


def main() -> None:
    frac, out = float(sys.argv[1]), Path(sys.argv[2])
    seeds = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else range(20)
    Args.clients = sys.argv[4] if len(sys.argv) > 4 else "all"
    planned.SIMULATED["max_spec_vram_fraction"] = frac
    setup = planned.PlannedPolicy.setup

    def with_slice(self, sim):
        sim.config.spec_fraction = frac
        setup(self, sim)

    planned.PlannedPolicy.setup = with_slice  # type: ignore[method-assign]
    done = set()
    if out.exists():
        done = {(r["cell"], r["seed"]) for r in map(json.loads, out.read_text().splitlines())}
    for seed in seeds:
        for cell in CELLS:
            if (cell, seed) in done:
                continue
            r = run_one(job_for(parse_cells(cell)[0], seed, Args))
            r["spec_fraction"] = frac
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(cell, seed, {k: round(v["ttft_p99_s"], 2) for k, v in r["policies"].items()})


if __name__ == "__main__":
    main()
