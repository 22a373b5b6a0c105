"""Diagnosis: predictive with one component switched off (noretain: no leases;
noonset; nowarm: no warm-ups; retainonly: leases, no copies; noplan: the reactive fallback alone).
Usage: python -m experiments.speculation_tail.diag_variants '{"seed":0,"tenants":60}' noretain,retainonly"""

import json
import sys

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from experiments.speculation_tail.diag_setup import scaleout_setup

kw = json.loads(sys.argv[1])
variants = sys.argv[2].split(",")
setup = scaleout_setup(kw)
cfg, wl = setup.config, setup.workload
for v in variants:
    pol = make_policy("reactive" if v == "reactive" else "predictive")
    if v == "noretain":
        pol._retain = lambda *a, **k: None
    if v == "noonset":
        pol._maybe_onset = lambda *a, **k: None
    if v == "noplan":
        pol._plan_round = lambda *a, **k: None
    if v == "nowarm":
        orig = pol._engine_states

        pol._engine_states = lambda sim, t, H, o=orig: [
            e for e in o(sim, t, H) if e.lifecycle == "serving"
        ]
    if v == "retainonly":
        pol._execute = lambda *a, **k: None
    r = Simulation(cfg, wl, pol, seed=kw.get("seed", 0)).run()
    sel = r.arrivals >= 300
    print(
        v,
        "p50/p99",
        np.percentile(r.ttft[sel], 50).round(2),
        np.percentile(r.ttft[sel], 99).round(2),
        "hit",
        round(r.cached_tokens.sum() / r.input_tokens.sum(), 4),
        "GB",
        round(r.bytes_moved / 1e9),
        flush=True,
    )
