"""This study: how much of a 60-tenant scale-out seed's p99 is the seed's own trajectory. The
scale-out's ramp-in balance (a joined engine takes any request whose cache-aware choice queues
> 0.5 s longer than it) is metastable; this runs each policy with that guard at 0.45, 0.5 and
0.55 s, a change no policy acts on, and appends one JSON row per (seed, guard) to a JSONL file
(resumable: rows already there are skipped). Policies: any of the simulator's, and
predictive-noretain (predictive without leases).
Usage: python -m experiments.speculation_tail.diag_perturb OUT.jsonl '{"tenants":60}' 0,1,...,9 \
    0.45,0.5,0.55 reactive,predictive"""

import json
import os
import sys

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.scenarios import build

out, kw = sys.argv[1], json.loads(sys.argv[2])
seeds = [int(x) for x in sys.argv[3].split(",")]
guards = [float(x) for x in sys.argv[4].split(",")]
names = sys.argv[5].split(",")
done = set()
if os.path.exists(out):
    for line in open(out):
        r = json.loads(line)
        done.add((r["seed"], r["guard"], r["policy"]))
for seed in seeds:
    setup = build(
        workload="servegen",
        scenario=kw.get("scenario", "scaleout"),
        model="llama3-70b",
        duration=1200,
        seed=seed,
        **{k: v for k, v in kw.items() if k != "scenario"},
    )
    for guard in guards:
        setup.config.balance_wait_s = guard
        for name in names:
            if (seed, guard, name) in done:
                continue
            pol = make_policy(name.removesuffix("-noretain"))
            if name.endswith("-noretain"):
                pol._retain = lambda *a, **k: None
            r = Simulation(setup.config, setup.workload, pol, seed=seed).run()
            sel = r.arrivals >= 300
            row = {
                "seed": seed,
                "guard": guard,
                "policy": name,
                **kw,
                "p50": round(float(np.percentile(r.ttft[sel], 50)), 3),
                "p99": round(float(np.percentile(r.ttft[sel], 99)), 3),
                "mean": round(float(r.ttft[sel].mean()), 3),
                "backlog_end_s": round(float(r.backlog_s), 2),
                "bytes_moved": float(r.bytes_moved),
            }
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
