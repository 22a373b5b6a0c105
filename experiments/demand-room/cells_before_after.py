"""Per-cell verdicts of the grid summaries, before (``shipped-reactive-grid``) and after (this
study): predictive clean against the shipped reactive, each strategy clean against both
baselines and worse beyond noise than one, counted over the 72 cells, and the cells that changed.

    python experiments/demand-room/cells_before_after.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
BEFORE = HERE.parent / "shipped-reactive-grid" / "summary-seeds-0-2.json"
AFTER = HERE / "summary-seeds-0-2.json"


def _verdicts(path: Path) -> dict:
    out = {}
    for c in json.loads(path.read_text())["cells"]:
        key = f"{c['setting']} {c['model'].replace('llama3-', '')} {c['scenario']}"
        b = c["against_baselines"]
        out[key] = {
            "predictive / reactive clean": c["clean"],
            "predictive clean vs baselines": b["predictive"]["clean"],
            "reactive clean vs baselines": b["reactive"]["clean"],
            "predictive worse than a baseline": b["predictive"]["worse_beyond_noise"],
            "reactive worse than a baseline": b["reactive"]["worse_beyond_noise"],
        }
    return out


def main() -> None:
    before, after = _verdicts(BEFORE), _verdicts(AFTER)
    for name in next(iter(before.values())):
        n0 = sum(v[name] for v in before.values())
        n1 = sum(v[name] for v in after.values())
        flips = [k for k in after if before[k][name] != after[k][name]]
        print(f"{name}: {n0} -> {n1} of {len(after)} cells")
        for k in flips:
            print(f"  {k}: {before[k][name]} -> {after[k][name]}")


if __name__ == "__main__":
    main()
