"""The grid's seed-cells so far (``merged.jsonl``), flagged: each unsaturated seed-cell where
predictive's p99 is above 1.25x the shipped reactive's, and where either strategy's is above
1.25x the better of the routing-time rule and hot fanout on that seed.

    python experiments/shipped-reactive-grid/flags.py [MERGED.jsonl]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from controlplane.sim.seeds import why_left_out

HERE = Path(__file__).parent
LIMIT = 1.25


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "merged.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    seeds: dict[int, int] = {}
    for r in rows:
        seeds[r["seed"]] = seeds.get(r["seed"], 0) + 1
    left = [(r["cell"], r["seed"]) for r in rows if why_left_out(r)]
    kept = [r for r in rows if not why_left_out(r)]
    print(
        f"{len(rows)} seed-cells (cells per seed: {dict(sorted(seeds.items()))}); left out "
        f"(everywhere's p99 over 10 s): {len(left)} {left}"
    )
    flags: dict[str, list] = {
        "predictive / reactive": [],
        "predictive / better baseline": [],
        "reactive / better baseline": [],
    }
    for r in kept:
        p = {n: v["ttft_p99_s"] for n, v in r["policies"].items()}
        best = min(p["routing-reactive"], p["hot-fanout"])
        for name, ratio in (
            ("predictive / reactive", p["predictive"] / p["reactive"]),
            ("predictive / better baseline", p["predictive"] / best),
            ("reactive / better baseline", p["reactive"] / best),
        ):
            if ratio > LIMIT:
                flags[name].append(
                    f"{r['cell'].replace(':llama3-', ' ')} s{r['seed']} {ratio:.2f}x"
                )
    for name, got in flags.items():
        print(f"{name} above {LIMIT}x: {len(got)} of {len(kept)}")
        for line in got:
            print(f"  {line}")


if __name__ == "__main__":
    main()
