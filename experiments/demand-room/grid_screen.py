"""The grid screen, before and after, on the seed-cells AFTER holds: per strategy, the
unsaturated seed-cells above 1.25x the better of the routing-time rule and hot fanout, and
predictive's above 1.25x the shipped reactive; before = ``shipped-reactive-grid/merged.jsonl``.

    python experiments/demand-room/grid_screen.py AFTER.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from controlplane.sim.seeds import why_left_out

BEFORE = Path(__file__).parent.parent / "shipped-reactive-grid" / "merged.jsonl"
LIMIT = 1.25


def _flags(r: dict, pols: dict) -> dict[str, float]:
    best = min(r["routing-reactive"], r["hot-fanout"])
    return {
        "predictive / reactive": pols["predictive"] / pols["reactive"],
        "predictive / better baseline": pols["predictive"] / best,
        "reactive / better baseline": pols["reactive"] / best,
    }


def main() -> None:
    before = {(r["cell"], r["seed"]): r for r in map(json.loads, BEFORE.read_text().splitlines())}
    after = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines() if x.strip()]
    counts = {"before": {}, "after": {}}
    changed = []
    n = 0
    for a in after:
        b = before[(a["cell"], a["seed"])]
        if why_left_out(b):
            continue
        n += 1
        p99 = {k: v["ttft_p99_s"] for k, v in b["policies"].items()}
        new = {k: v["ttft_p99_s"] for k, v in a["policies"].items()}
        for when, pols in (("before", p99), ("after", new)):
            for name, ratio in _flags(p99, pols).items():
                if ratio > LIMIT:
                    counts[when].setdefault(name, []).append(
                        f"{a['cell'].replace(':llama3-', ' ')} s{a['seed']} {ratio:.2f}x"
                    )
        for pol in ("reactive", "predictive"):
            if abs(new[pol] - p99[pol]) > 0.1 * p99[pol]:
                changed.append(f"{a['cell']} s{a['seed']} {pol} {p99[pol]:.2f} -> {new[pol]:.2f} s")
    print(f"{n} unsaturated seed-cells")
    for name in (
        "predictive / reactive",
        "predictive / better baseline",
        "reactive / better baseline",
    ):
        print(
            f"{name} above {LIMIT}x: before {len(counts['before'].get(name, []))}, "
            f"after {len(counts['after'].get(name, []))}"
        )
        for when in ("before", "after"):
            print(f"  {when}: {', '.join(counts[when].get(name, []))}")
    print(f"p99 moved by more than 10% ({len(changed)}):")
    for line in changed:
        print(f"  {line}")


if __name__ == "__main__":
    main()
