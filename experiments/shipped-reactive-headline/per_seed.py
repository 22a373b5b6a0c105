"""Every seed of the headline: each policy's p99 TTFT, predictive over the shipped reactive,
and each strategy over the better of the two baselines beside it (routing-reactive, hot-fanout),
as a markdown table (from ``merged.jsonl``, ``merge.py``'s output)."""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.sim.seeds import why_left_out

HERE = Path(__file__).parent
NAMES = ("reactive", "routing-reactive", "hot-fanout", "predictive", "everywhere")


def table() -> str:
    rows = [
        "| cell | seed | " + " | ".join(f"{n} p99 s" for n in NAMES) + " | predictive / "
        "reactive | reactive / best baseline | predictive / best baseline | ingest copies "
        "(re-plans the bound held back) reactive, predictive | guard: copies watched, harmful rounds "
        "(predictive) | left out |",
        "|" + "---|" * (len(NAMES) + 8),
    ]
    for line in (HERE / "merged.jsonl").read_text().splitlines():
        r = json.loads(line)
        p = {n: r["policies"][n]["ttft_p99_s"] for n in NAMES}
        best = min(p["routing-reactive"], p["hot-fanout"])
        ing = [r["policies"][n].get("ingest", {}) for n in ("reactive", "predictive")]
        g = r["policies"]["predictive"].get("guard", {})
        rows.append(
            f"| {r['scenario']} | {r['seed']} | "
            + " | ".join(f"{p[n]:.2f}" for n in NAMES)
            + f" | {p['predictive'] / p['reactive']:.2f}x | {p['reactive'] / best:.2f}x | "
            f"{p['predictive'] / best:.2f}x | "
            + ", ".join(f"{i.get('copies', 0)} ({i.get('held_back_replans', 0)})" for i in ing)
            + f" | {g.get('copies_watched', 0)}, {g.get('harmful_rounds', 0)} | "
            f"{why_left_out(r) or '-'} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
