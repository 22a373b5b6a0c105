"""This study diagnosis of a worst seed: what the p99 tail (the measured requests at or above the
p99 TTFT, after the 300 s warm-up) is made of, per policy. The tail by minute, by prefix and by
engine (hits / misses of the whole prefix), the busiest tail engines' prefill work per minute
(every request they served, in seconds of prefill), and the replicas placed of the tail's top
prefix (when, where, speculative or not, used or not).
Usage: python -m experiments.speculation_tail.diag_tail '{"seed":15,"scenario":"slowlink"}' reactive,predictive
(keys as in a grid job: model, scenario, seed, workload, tenants, load, engines; defaults those of
``prewarm-sim grid``)."""

import json
import sys
from collections import Counter

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.workloads.base import BLOCK_TOKENS
from experiments.speculation_tail.diag_setup import setup_for

kw = json.loads(sys.argv[1])
pols = sys.argv[2].split(",")
seed = kw.get("seed", 0)
setup = setup_for(kw)
cfg, wl = setup.config, setup.workload
P = np.array([len(p) * BLOCK_TOKENS for p in wl.prefixes])[wl.pid]
for name in pols:
    sim = Simulation(cfg, wl, make_policy(name), seed=seed)
    r = sim.run()
    sel = r.arrivals >= 300
    thr = np.percentile(r.ttft[sel], 99)
    tail = sel & (r.ttft >= thr)
    miss = r.cached_tokens < P
    work = np.array(
        [
            sim.prefill_s(r.input_tokens[i] - r.cached_tokens[i], r.cached_tokens[i])
            for i in range(len(wl))
        ]
    )
    minute = (r.arrivals // 60).astype(int)
    print(
        f"{name}: p50 / p99 {np.percentile(r.ttft[sel], 50):.2f} / {thr:.2f} s, tail "
        f"{int(tail.sum())} requests ({int((tail & miss).sum())} misses), "
        f"{r.bytes_moved / 1e9:.0f} GB moved, {len(r.replicas)} replicas "
        f"({sum(1 for x in r.replicas if x.speculative)} speculative)"
    )
    print("   tail by minute", Counter(minute[tail].tolist()).most_common(5))
    top = Counter(wl.pid[tail].tolist()).most_common(3)
    for pid, cnt in top:
        m = tail & (wl.pid == pid)
        print(
            f"   tail prefix {pid} ({len(wl.prefixes[pid])} blocks): {cnt} tail requests, "
            f"{int((m & miss).sum())} misses, mean TTFT of all its measured requests "
            f"{r.ttft[sel & (wl.pid == pid)].mean():.2f} s"
        )
    engines = Counter(r.engine_of[tail].tolist()).most_common(3)
    print("   tail by engine", engines)
    lo, hi = int(minute[tail].min()), int(minute[tail].max())
    for eid, _ in engines:
        on = r.engine_of == eid
        per = [round(float(work[on & (minute == m)].sum())) for m in range(lo, hi + 1)]
        nmiss = [int((on & miss & (minute == m)).sum()) for m in range(lo, hi + 1)]
        print(f"   engine {eid} prefill s/min over minutes {lo}-{hi}: {per}, misses {nmiss}")
    pid = top[0][0]
    reps = [x for x in r.replicas if x.pid == pid]
    print(
        f"   replicas of prefix {pid}:",
        [
            (
                round(x.placed_at),
                x.engine,
                "spec" if x.speculative else "ondemand",
                r.replica_used.get(x.rid),
            )
            for x in reps
        ],
    )
