"""Why the planner placed no replica of one prefix in a time window, one grid job of the 70B
headline under `predictive`: at every re-plan of that prefix, its demand, holders, spare capacity,
overflow, back-off, the engines allowed, the prefix's bytes against each allowed engine's room,
and each replica the planner then weighed.

    PYTHONPATH=. python experiments/headline-20-seeds/why_no_copy.py slowlink 15 21 595 640
    # scenario, seed, prefix, from, to (trace seconds)[, client half: all, tune or holdout]
"""

import sys

from controlplane.core.policy import planner as PL
from controlplane.sim import planned as P
from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from experiments.speculation_tail.diag_setup import setup_for

PID, T0, T1 = sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
setup = setup_for(
    {"seed": int(sys.argv[2]), "scenario": sys.argv[1], "clients": (sys.argv[6:] or ["all"])[0]}
)
pol = make_policy("predictive")
cur = {"t": None, "on": False}
orig_pr = P.PlannedPolicy._plan_round


def pr(self, sim, t, only=None, at_ingest=False):
    cur["on"] = bool(only and int(PID) in only and T0 <= t <= T1)
    cur["t"] = t
    r = orig_pr(self, sim, t, only, at_ingest)
    cur["on"] = False
    return r


P.PlannedPolicy._plan_round = pr
orig_ov = PL._overflowing


def ov(r):
    heap, state = orig_ov(r)
    if cur["on"]:
        c = r.cands.get(PID)
        d = r.dem.get(PID)
        H = r.budgets.horizon_s
        print(
            f"t={cur['t']:.1f} cand={c is not None} dem={d} eligible={r.eligible(c, d) if c else None}"
        )
        if c:
            holders = r.gpu_holders.get(PID, ())
            lam = PL._rate(d, H) if d else 0
            cap = sum(r.spare[h] for h in holders) / c.service_s * r.budgets.target_utilisation
            print(
                f"   holders {holders} spare {[round(r.spare[h], 2) for h in holders]} service_s {c.service_s:.2f} lam {lam:.2f} cap {cap:.2f} backoff {r.backoff} around {PL.backs_off_around(r.engines, r.budgets, holders)} allowed {len(r.allowed)} of {len(r.engines)} state {state.get(PID)}"
            )
            print(
                f"   nbytes {c.nbytes / 1e9:.1f} GB bytes_left {r.bytes_left / 1e9:.1f} GB rooms(allowed) {sorted(round(r.room[e] / 1e9, 1) for e in r.allowed)} max_rep {r.budgets.max_replicas_per_prefix}"
            )
            eng = r.by_engine["e0"]
            print(
                f"   e0 free {eng.free_bytes / 1e9:.1f} cap {eng.kv_capacity_bytes / 1e9:.1f} spec {eng.spec_bytes / 1e9:.1f} speccap {r.budgets.spec_cap_bytes(eng.kv_capacity_bytes) / 1e9:.1f}"
            )
            print(
                "   engines queue/load:",
                sorted(
                    (e.engine_id, round(e.queue_s, 2), round(e.load, 2))
                    for e in r.engines
                    if e.lifecycle == "serving"
                )[:16],
            )
    return heap, state


PL._overflowing = ov
orig_rep = PL._replica


def rep(r, c, d, overflow, best, queued):
    it = orig_rep(r, c, d, overflow, best, queued)
    if cur["on"] and c.prefix_id == PID:
        print(f"   replica to {best}: overflow {overflow:.2f} -> {it}")
    return it


PL._replica = rep
sim = Simulation(setup.config, setup.workload, pol, seed=int(sys.argv[2]))
sim.run()
