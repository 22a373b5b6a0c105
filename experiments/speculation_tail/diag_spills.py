"""This study diagnosis of the 60-tenant harm: per policy, where its misses come from. Each request
is classed at routing: sent by the scale-out's ramp-in balance (the cache-aware choice queued
> 0.5 s longer than a joined engine) or by the cache-aware choice itself; and whether a serving
engine held its whole prefix at that moment (a miss with a holder is the router's; without one
the prefix was lost or never computed). Per minute: misses, their recompute seconds, spills, the
serving engines' mean queue, and blocks under lease or speculative on the serving engines.
Usage: python -m experiments.speculation_tail.diag_spills '{"seed":0,"tenants":60}' reactive,predictive
(``predictive-noretain``: predictive without leases)."""

import json
import math
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
n = len(wl)
for name in pols:
    pol = make_policy(name.removesuffix("-noretain"))
    if name.endswith("-noretain"):  # predictive without leases
        pol._retain = lambda *a, **k: None
    sim = Simulation(cfg, wl, pol, seed=kw.get("seed", 0))
    spill = np.zeros(n, dtype=bool)
    held = np.zeros(n, dtype=bool)
    orig = pol.route
    guard = cfg.balance_wait_s
    per_min: dict[int, list[float]] = {}

    def route(sim, i, t, keys, orig=orig, held=held, spill=spill, per_min=per_min, guard=guard):
        full = len(keys)
        held[i] = any(e.cache.match(keys) == full for e in sim.serving)
        sim.config.balance_wait_s = math.inf
        free = orig(sim, i, t, keys)
        sim.config.balance_wait_s = guard
        out = orig(sim, i, t, keys)
        spill[i] = out[0] is not free[0]
        m = int(t // 60)
        if m not in per_min:
            serving = sim.serving
            q = sum(e.wait(t) for e in serving) / max(1, len(serving))
            pinned = sum(sum(1 for k, u in e.cache.pinned.items() if u > t) for e in serving)
            spec = sum(len(e.cache.spec) for e in serving)
            per_min[m] = [round(q, 1), pinned, spec]
        return out

    pol.route = route
    r = sim.run()
    miss = r.cached_tokens < P
    rec = np.array(
        [
            sim.prefill_s(
                P[i] - r.cached_tokens[i] + (r.input_tokens[i] - P[i]), r.cached_tokens[i]
            )
            - sim.prefill_s(r.input_tokens[i] - P[i], P[i])
            if miss[i]
            else 0.0
            for i in range(n)
        ]
    )
    sel = r.arrivals >= 300
    b = (r.arrivals // 60).astype(int)
    print(
        name,
        "p50/p99",
        np.percentile(r.ttft[sel], 50).round(2),
        np.percentile(r.ttft[sel], 99).round(2),
        "| misses",
        int(miss.sum()),
        "work",
        round(rec.sum()),
        "| spilled",
        int(spill.sum()),
        "spill misses",
        int((spill & miss).sum()),
        "work",
        round(rec[spill].sum()),
        "| misses with a holder (not spilled)",
        int((miss & held & ~spill).sum()),
        "work",
        round(rec[miss & held & ~spill].sum()),
        "| misses, no holder",
        int((miss & ~held).sum()),
        "work",
        round(rec[miss & ~held].sum()),
        "| GB",
        round(r.bytes_moved / 1e9),
        flush=True,
    )
    for label, w in (
        ("miss work/min   ", rec),
        ("spill work/min  ", rec * spill),
        ("noholder work/m ", rec * (miss & ~held)),
        ("spills/min      ", spill.astype(float)),
    ):
        print("  ", label, [int(x) for x in np.bincount(b, weights=w)])
    print("   queue,pinned,spec/min", [per_min.get(m) for m in range(int(b.max()) + 1)])
