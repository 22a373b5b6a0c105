"""Per seed: the shipped reactive and predictive before this change (``shipped-reactive-headline``)
against predictive with the concentration signal (``runs.jsonl`` here), and the paired p99 gains.

    python experiments/concentration-trace/compare.py
"""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.sim.seeds import gain_stats

HERE = Path(__file__).parent
BEFORE = HERE.parent / "shipped-reactive-headline" / "runs.jsonl"


def load(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[(r["cell"].split(":")[-1], r["seed"])] = r["policies"]
    return out


def main() -> None:
    before, after = load(BEFORE), load(HERE / "runs.jsonl")
    print(
        "| cell | seed | reactive p99 s | predictive before | after | before / reactive | "
        "after / reactive | narrowed, restored, held back |"
    )
    print("|---|---|---|---|---|---|---|---|")
    cells: dict[str, list] = {}
    for (cell, seed), pol in sorted(after.items()):
        if (cell, seed) not in before:
            continue
        r = before[(cell, seed)]["reactive"]["ttft_p99_s"]
        b = before[(cell, seed)]["predictive"]["ttft_p99_s"]
        a = pol["predictive"]["ttft_p99_s"]
        g = pol["predictive"].get("guard", {})
        cells.setdefault(cell, []).append((seed, r, b, a))
        print(
            f"| {cell} | {seed} | {r:.2f} | {b:.2f} | {a:.2f} | {b / r:.2f}x | {a / r:.2f}x | "
            f"{g.get('narrowed')}, {g.get('spread_restored')}, {g.get('spread_held_back')} |"
        )
    for cell, rows in cells.items():
        seeds = [s for s, *_ in rows]
        for label, i in (("before", 2), ("after", 3)):
            st = gain_stats([x[1] for x in rows], [x[i] for x in rows])
            print(
                f"{cell} seeds {seeds} predictive {label}: p99 gain over reactive "
                f"{st['mean']:+.1%} +- {st['noise']:.1%} (df {len(rows) - 1}), worst "
                f"{max(x[i] / x[1] for x in rows):.2f}x"
            )


if __name__ == "__main__":
    main()
