"""Run ``reactive`` and ``predictive`` (the simulator as checked out) on CELLS x SEEDS for one
client half; one JSON line per seed-cell appended to OUT (seed-cells already there skipped).

    PYTHONPATH=. python experiments/demand-room/run_cells.py OUT.jsonl CELLS SEEDS [HALF [POLICIES]]
    # CELLS: comma-separated grid cells (``prewarm-sim grid --cells``), or ``headline``
    # HALF: all (default), tune or holdout (``--clients``)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from controlplane.sim.grid import job_for, parse_cells
from controlplane.sim.seeds import run_one

HEADLINE = "servegen:llama3-70b:scaleout,servegen:llama3-70b:slowlink"


class Args:
    policies = ["reactive", "predictive"]
    duration = 1200.0
    warmup = 300.0
    trace_dir = None
    clients = "all"


def main() -> None:
    out, cells = Path(sys.argv[1]), sys.argv[2]
    cells = HEADLINE if cells == "headline" else cells
    seeds = [int(s) for s in sys.argv[3].split(",")]
    Args.clients = sys.argv[4] if len(sys.argv) > 4 else "all"
    if len(sys.argv) > 5:
        Args.policies = sys.argv[5].split(",")
    done = set()
    if out.exists():
        done = {(r["cell"], r["seed"]) for r in map(json.loads, out.read_text().splitlines())}
    for seed in seeds:
        for cell in parse_cells(cells):
            job = job_for(cell, seed, Args)
            if (job["cell"], seed) in done:
                continue
            r = run_one(job)
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(
                r["cell"],
                seed,
                {k: round(v["ttft_p99_s"], 2) for k, v in r["policies"].items()},
                flush=True,
            )


if __name__ == "__main__":
    main()
