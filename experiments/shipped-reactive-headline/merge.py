"""The headline's runs with the baselines beside them: this folder's ``runs.jsonl`` (the shipped
``reactive`` and ``predictive``, rerun) and, from ``experiments/speculation_tail/
headline-backoff.jsonl``, the policies this change does not touch: its ``reactive`` (the
routing-time rule, now ``routing-reactive``; seed 0 scale-out checked identical to the last
digit: 0.874 / 9.712 s), ``hot-fanout`` and ``everywhere``. Seeds the reruns do not hold yet are
left out, not mixed.

    python -m experiments.shipped-reactive-headline.merge  (or: python experiments/.../merge.py)
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
BASE = HERE.parent / "speculation_tail" / "headline-backoff.jsonl"
ORDER = ("reactive", "routing-reactive", "hot-fanout", "predictive", "everywhere")


def merged() -> list[dict]:
    base = {}
    for line in BASE.read_text().splitlines():
        r = json.loads(line)
        base[(r["cell"], r["seed"])] = r
    out = []
    for line in (HERE / "runs.jsonl").read_text().splitlines():
        r = json.loads(line)
        b = base[(r["cell"], r["seed"])]["policies"]
        pols = {
            "reactive": r["policies"]["reactive"],
            "routing-reactive": b["reactive"],
            "hot-fanout": b["hot-fanout"],
            "predictive": r["policies"]["predictive"],
            "everywhere": b["everywhere"],
        }
        out.append({**r, "policies": {n: pols[n] for n in ORDER}})
    return out


if __name__ == "__main__":
    rows = merged()
    (HERE / "merged.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} seed(s) in {HERE / 'merged.jsonl'}")
