"""Diagnosis: why the fair reactive rule's copies of one prefix are refused room.
On each refused on-demand copy of prefix PID between T0 and T1 (s), the target's cache is
classed block by block: referenced by a queued or running request, used on the target within
the value horizon (the rule keeps those whatever their rate), under a lease, and otherwise the
value the rule ranks it by; printed summed over refusals per target, with the copy's budget.
Usage: python -m experiments.speculation_tail.diag_room '{"seed":15,"scenario":"slowlink"}' 21 600 640 \
    reactive,predictive"""

import math
import sys
from collections import defaultdict

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.policies import VALUE_HORIZON_S
from controlplane.sim.policy_factory import make_policy
from experiments.speculation_tail.diag_setup import prefix_window_args

kw, PID, T0, T1, POLICIES, setup = prefix_window_args(sys.argv)
cfg, wl = setup.config, setup.workload

for name in POLICIES:
    pol = make_policy(name)
    sim = Simulation(cfg, wl, pol, seed=kw.get("seed", 0))
    orig = sim.start_copy
    rows: dict[int, list[float]] = defaultdict(lambda: [0.0] * 8)

    def start_copy(pid, keys, src, dst, now, speculative, *a, orig=orig, rows=rows, **k):
        out = orig(pid, keys, src, dst, now, speculative, *a, **k)
        if out is None and pid == PID and not speculative and T0 <= now <= T1:
            c = dst.cache
            value_of, budget = k.get("value_of"), k.get("budget", math.inf)
            missing = sum(1 for x in keys if x not in c.blocks)
            busy = recent = leased = cheap = 0
            for key, used in c.blocks.items():
                if used >= c.busy_since:
                    busy += 1
                elif used > now - VALUE_HORIZON_S:
                    recent += 1
                    leased += c.pinned.get(key, -math.inf) > now
                elif value_of is not None and value_of(key) < budget:
                    cheap += 1
            r = rows[dst.eid]
            for i, v in enumerate((1, missing, c.free, busy, recent, leased, cheap, budget)):
                r[i] += v
        return out

    sim.start_copy = start_copy
    res = sim.run()
    p99 = float(np.percentile(res.ttft[res.arrivals >= 300], 99))
    print(f"{name}: p99 {p99:.2f} s; refused copies of prefix {PID} by target")
    print("  target refusals | per refusal: missing free referenced recent(leased) cheap budget_s")
    for eid, r in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        n = r[0]
        print(
            f"  e{eid:<3d} {int(n):5d} | {r[1] / n:7.0f} {r[2] / n:5.0f} {r[3] / n:8.0f} "
            f"{r[4] / n:7.0f}({r[5] / n:4.0f}) {r[6] / n:6.0f} {r[7] / n:7.1f}"
        )
