"""This study's before/after table: per 70B grid cell, predictive's p99 gain over reactive and
its gap closed against ``everywhere``, with the earlier fallback (``experiments/unified-grid``)
and with this one, and whether the cell is clean in each.
Usage: python -m experiments.fallback_room.compare_grids experiments/unified-grid/grid-70b.json \
    experiments/fallback_room/grid70.json"""

import json
import sys


def cells(path):
    return {(c["setting"], c["scenario"]): c for c in json.load(open(path))["cells"]}


def pct(x):
    return "-" if x is None else f"{100 * x:+.0f}%"


before, after = cells(sys.argv[1]), cells(sys.argv[2])
print(
    "| setting | scenario | gain p99 before | after | gap closed before | after | clean before | after |"
)
print("|---|---|---|---|---|---|---|---|")
for key, a in after.items():
    b = before.get(key)
    if b is None:
        continue
    print(
        f"| {key[0]} | {key[1]} | {pct(b['gain_p99'])} | {pct(a['gain_p99'])} | "
        f"{pct(b['gap_closed_everywhere_p99'])} | {pct(a['gap_closed_everywhere_p99'])} | "
        f"{'yes' if b['clean'] else '**no**'} | {'yes' if a['clean'] else '**no**'} |"
    )
