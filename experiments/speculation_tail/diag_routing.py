"""Diagnosis: where each request of one prefix went between T0 and T1 (s), per policy,
and what the router saw: the four serving engines holding most of the prefix (blocks held,
engine, queue s) at that request's arrival.
Usage: python -m experiments.speculation_tail.diag_routing '{"seed":0,"scenario":"slowlink","load":0.7}' 26 \
    1010 1075 reactive,predictive
(keys as in a grid job: model, scenario, seed, workload, tenants, load, engines)."""

import sys

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from experiments.speculation_tail.diag_setup import prefix_window_args

kw, PID, T0, T1, POLICIES, setup = prefix_window_args(sys.argv)
seed = kw.get("seed", 0)
cfg, wl = setup.config, setup.workload
for name in POLICIES:
    pol = make_policy(name)
    sim = Simulation(cfg, wl, pol, seed=seed)
    orig = pol.route
    seen: list = []

    def route(s, i, t, keys, orig=orig, seen=seen):
        out = orig(s, i, t, keys)
        if wl.pid[i] == PID and T0 <= t < T1:
            best = sorted(
                ((e.cache.match(keys), e.eid, round(e.wait(t), 1)) for e in s.serving),
                reverse=True,
            )[:4]
            seen.append((round(t, 1), out[0].eid, best))
        return out

    pol.route = route
    sim.run()
    print(f"{name}: prefix {PID} ({len(wl.prefixes[PID])} blocks)")
    for t, eid, best in seen:
        print(f"   {t} s -> engine {eid}; best holders (blocks, engine, queue s): {best}")
