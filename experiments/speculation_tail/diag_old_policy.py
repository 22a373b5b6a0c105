"""Diagnosis: 70B scale-out, 20-minute windows, seeds 0-4, at peak load 0.7, 60 and
15 tenants, 8 and 32 engines (reactive, predictive, oracle). Run at commit fa9551e (the policy
before this study) from the repository root with PREWARM_SHARED_DATA set; output:
diag-old-policy.jsonl (per policy: p50, p99 s, TB moved, speculative replicas, backlog at the end)."""

import json
from concurrent.futures import ProcessPoolExecutor

from controlplane.sim.seeds import run_one

cells = [dict(load=0.7), dict(tenants=60), dict(engines=8), dict(engines=32), dict(tenants=15)]
jobs = []
for c in cells:
    for s in range(5):
        jobs.append(
            {
                "model": "llama3-70b",
                "scenario": "scaleout",
                "seed": s,
                "policies": ["reactive", "predictive", "oracle"],
                "duration": 1200,
                "warmup": 300.0,
                **c,
            }
        )


def one(j):
    r = run_one(j)
    return r


with ProcessPoolExecutor(2) as pool:
    for r in pool.map(one, jobs):
        p = r["policies"]
        line = {k: r.get(k) for k in ("load", "tenants", "engines", "seed")}
        line["ol"] = round(r["offered_load"]["peak_5min"], 2)
        for n in ("reactive", "predictive", "oracle"):
            line[n] = (
                round(p[n]["ttft_p50_s"], 2),
                round(p[n]["ttft_p99_s"], 2),
                round(p[n]["bytes_moved"] / 1e12, 2),
                p[n]["speculative_replicas"],
                round(p[n]["backlog_end_s"], 1),
            )
        print(json.dumps(line), flush=True)
