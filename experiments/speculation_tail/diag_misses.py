"""Diagnosis: where the prefill work of a run goes. Per policy: requests that missed
their prefix, the recompute seconds they cost (in all and on engines that joined the
scale-out), per minute. NOBAL=1 turns off the scale-out ramp-in balance (cfg.balance_wait_s).
Usage: python -m experiments.speculation_tail.diag_misses '{"seed":0,"tenants":60}' reactive,predictive"""

import json
import sys

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from experiments.speculation_tail.diag_setup import prefix_tokens, scaleout_setup

kw = json.loads(sys.argv[1])
pols = sys.argv[2].split(",")
setup = scaleout_setup(kw)
cfg, wl = setup.config, setup.workload
P = prefix_tokens(wl)
half = cfg.engines // 2
for name in pols:
    sim = Simulation(cfg, wl, make_policy(name), seed=kw.get("seed", 0))
    r = sim.run()
    sel = r.arrivals >= 300
    miss = r.cached_tokens < P
    # recompute cost of missing prefix tokens
    rec = np.array(
        [
            sim.prefill_s(
                P[i] - r.cached_tokens[i] + (r.input_tokens[i] - P[i]), r.cached_tokens[i]
            )
            - sim.prefill_s(r.input_tokens[i] - P[i], P[i])
            if miss[i]
            else 0.0
            for i in range(len(P))
        ]
    )
    newe = r.engine_of >= half
    print(
        name,
        "p50/p99",
        np.percentile(r.ttft[sel], 50).round(2),
        np.percentile(r.ttft[sel], 99).round(2),
        "misses",
        int(miss.sum()),
        "miss work s",
        round(rec.sum()),
        "on new engines",
        round(rec[newe].sum()),
        "hit",
        round(r.cached_tokens.sum() / r.input_tokens.sum(), 4),
        "spec",
        sum(1 for x in r.replicas if x.speculative),
        "demand copies",
        sum(1 for x in r.replicas if not x.speculative),
    )
    b = (r.arrivals // 60).astype(int)
    print("  miss work/min:", [int(x) for x in np.bincount(b, weights=rec)])
    print("  misses/min   :", [int(x) for x in np.bincount(b, weights=miss)])
    print(
        "  mean ttft/min:",
        [
            round(float(x), 1)
            for x in np.bincount(b, weights=r.ttft) / np.maximum(1, np.bincount(b))
        ],
    )
