"""Summarize diag_perturb.py's JSONL: per seed, each policy's p99 at each guard; per policy
against reactive, the paired p99 ratio (geometric mean over (seed, guard) trajectories, with a
95% bootstrap interval over seeds), how many trajectories exceed 1.25x reactive's p99, and
per seed the median over guards; once over every trajectory, once over those where reactive is
not saturated (its backlog at the end <= 30 s, the grid's "unsaturated seed").
Usage: python -m experiments.speculation_tail.summarize_perturb FILE.jsonl"""

import json
import math
import sys
from collections import defaultdict

import numpy as np

rows = [json.loads(x) for x in open(sys.argv[1])]
p99 = {(r["seed"], r["guard"], r["policy"]): r for r in rows}
seeds = sorted({r["seed"] for r in rows})
guards = sorted({r["guard"] for r in rows})
pols = [p for p in dict.fromkeys(r["policy"] for r in rows) if p != "reactive"]
print("seed | guard:", " ".join(f"{g:g}" for g in guards))
for s in seeds:
    line = []
    for p in ["reactive", *pols]:
        vals = [p99.get((s, g, p)) for g in guards]
        line.append(p + " " + "/".join(f"{v['p99']:.1f}" if v else "-" for v in vals))
    print(s, " | ".join(line))
rng = np.random.default_rng(0)
for p, only_unsat in [(p, u) for p in pols for u in (False, True)]:
    by_seed = defaultdict(list)
    over = total = 0
    for s in seeds:
        for g in guards:
            r, q = p99.get((s, g, "reactive")), p99.get((s, g, p))
            if not r or not q or (only_unsat and r["backlog_end_s"] > 30):
                continue
            ratio = q["p99"] / r["p99"]
            by_seed[s].append(math.log(ratio))
            total += 1
            over += ratio > 1.25
    ks = sorted(by_seed)
    if not ks:
        continue
    allv = [v for k in ks for v in by_seed[k]]
    boot = []
    for _ in range(2000):
        pick = rng.choice(len(ks), len(ks))
        vals = [v for i in pick for v in by_seed[ks[i]]]
        boot.append(math.exp(np.mean(vals)))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    med = {k: round(math.exp(np.median(by_seed[k])), 2) for k in ks}
    print(
        f"{p} vs reactive: p99 ratio geometric mean {math.exp(np.mean(allv)):.2f} "
        f"[{lo:.2f}, {hi:.2f}] over {total} {'unsaturated ' if only_unsat else ''}"
        f"trajectories ({len(ks)} seeds); "
        f"{over} above 1.25x; per-seed median ratio over guards {med}"
    )
