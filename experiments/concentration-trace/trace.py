"""Trace one seed of a grid cell under a planned policy: every copy (planner, ingest, fallback),
the holders of each prefix at every tick, and each request's engine, wait and TTFT.

    PYTHONPATH=. python experiments/concentration-trace/trace.py reactive 4 out.pkl
    # a cell and a client half (``--clients``: all, tune or holdout) after the seed:
    PYTHONPATH=. python experiments/concentration-trace/trace.py reactive 1 out.pkl \
        servegen:llama3-70b:scaleout holdout
"""

from __future__ import annotations

import pickle
import sys

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.grid import job_for, parse_cells
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.seeds import setup_of


class Args:
    policies = ["x"]
    duration = 1200.0
    warmup = 300.0
    trace_dir = None


def main() -> None:
    name, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cell = sys.argv[4] if len(sys.argv) > 4 else "servegen:llama3-70b:scaleout"
    args = Args()
    args.clients = sys.argv[5] if len(sys.argv) > 5 else "all"
    job = job_for(parse_cells(cell)[0], seed, args)
    setup = setup_of(job)
    pol = make_policy(name)
    wl = setup.workload
    n = len(wl)
    waits = np.zeros(n)
    items: list[tuple] = []
    fallback: list[tuple] = []
    ticks: list[tuple] = []
    route0 = pol.route

    def route(sim, i, t, keys):
        r = route0(sim, i, t, keys)
        e = r[0]
        waits[i] = max(0.0, e.free_at - t)
        return r

    pol.route = route
    if hasattr(pol, "_execute"):
        ex0 = pol._execute

        def execute(sim, it, t):
            items.append((t, int(it.prefix_id), it.source, it.target, it.tier, it.reason))
            return ex0(sim, it, t)

        pol._execute = execute
    if hasattr(pol, "_copied"):
        cp0 = pol._copied

        def copied(sim, pid, src, dst, t, land):
            fallback.append((t, pid, src.name, dst.name, land))
            return cp0(sim, pid, src, dst, t, land)

        pol._copied = copied
    tick0 = pol.on_tick

    def on_tick(sim, t):
        tick0(sim, t)
        hold = {}
        for pid in set(wl.pid[(wl.t > t - 60) & (wl.t <= t)].tolist()):
            keys = wl.prefixes[pid]
            hold[pid] = [e.eid for e in sim.serving if e.cache.match(keys) == len(keys)]
        q = {e.eid: max(0.0, e.free_at - t) for e in sim.serving}
        ticks.append((t, hold, q, [e.eid for e in sim.serving], sim.load(t)))

    pol.on_tick = on_tick
    if not pol.tick_s:
        pol.tick_s = 15.0
    r = Simulation(setup.config, wl, pol, seed=seed).run()
    sel = wl.t >= 300.0
    print(
        name, seed, "p99", float(np.percentile(r.ttft[sel], 99)), "mean", float(r.ttft[sel].mean())
    )
    print("guard", r.guard, "ingest", r.ingest)
    with open(out, "wb") as f:
        pickle.dump(
            {
                "t": wl.t,
                "pid": wl.pid,
                "wkey": wl.prefix_wkey,
                "plen": [len(p) for p in wl.prefixes],
                "ttft": r.ttft,
                "engine": r.engine_of,
                "cached": r.cached_tokens,
                "wait": waits,
                "items": items,
                "fallback": fallback,
                "ticks": ticks,
                "replicas": [
                    (x.pid, x.engine, x.speculative, x.placed_at, x.nbytes) for x in r.replicas
                ],
                "changes": [(c.eid, c.announce_s, c.serve_s) for c in setup.config.changes],
            },
            f,
        )


if __name__ == "__main__":
    main()
