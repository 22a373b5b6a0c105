"""This study's storm check: one grid job run with ``predictive``, every on-demand copy its
fallback started logged; prints the copies per minute, the (prefix, target) pairs copied most
often (a prefix copied to the same engine again and again was displaced in between) and the
prefixes copied most.
Usage: python -m experiments.fallback_room.diag_storm '{"seed":1,"scenario":"scaleout","load":0.7}'
(keys as in a grid job: model, scenario, seed, workload, tenants, load, engines)."""

import json
import sys
from collections import Counter

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from experiments.speculation_tail.diag_setup import setup_for

kw = json.loads(sys.argv[1])
setup = setup_for(kw)
sim = Simulation(setup.config, setup.workload, make_policy("predictive"), seed=kw.get("seed", 0))
log = []
orig = sim.start_copy


def start_copy(pid, keys, src, dst, now, speculative, *a, **k):
    out = orig(pid, keys, src, dst, now, speculative, *a, **k)
    if out is not None and not speculative:
        log.append((now, pid, dst.eid))
    return out


sim.start_copy = start_copy
r = sim.run()
sel = r.arrivals >= 300
print(
    f"p99 {np.percentile(r.ttft[sel], 99):.2f} s, on-demand copies {len(log)}, "
    f"{sim.bytes_moved / 1e12:.1f} TB moved"
)
print("per minute", sorted(Counter(int(t // 60) for t, _, _ in log).items()))
print("(prefix, target) copied most", Counter((p, d) for _, p, d in log).most_common(8))
top = Counter(p for _, p, _ in log).most_common(8)
print(
    "prefixes copied most (copies, blocks)",
    [(p, n, len(setup.workload.prefixes[p])) for p, n in top],
)
