"""The simulator set-up of one grid job, for the diagnosis scripts next to this one: the keys of
a ``prewarm-sim grid`` job (model, scenario, seed, workload, tenants, load, engines, duration),
with that command's defaults, and the same window start for the fixed traces
(``controlplane.sim.seeds.run_one``)."""

import json

from controlplane.sim.scenarios import build
from controlplane.sim.seeds import TRACE_SPAN_S, TRACE_WORKLOADS, WINDOW_STEP_S


def setup_for(kw: dict):
    seed = kw.get("seed", 0)
    workload = kw.get("workload", "servegen")
    duration = kw.get("duration", 1200.0)
    start = None
    if workload in TRACE_WORKLOADS:
        start = (seed * WINDOW_STEP_S) % max(TRACE_SPAN_S[workload] - duration, WINDOW_STEP_S)
    return build(
        workload=workload,
        start=start,
        scenario=kw.get("scenario", "steady"),
        model=kw.get("model", "llama3-70b"),
        engines=kw.get("engines", 16),
        tenants=kw.get("tenants", 30),
        duration=duration,
        load=kw.get("load", 0.55),
        seed=seed,
    )


def prefix_window_args(argv: list[str]):
    """``JOB_JSON PREFIX T0 T1 POLICIES``, the arguments of the per-prefix probes: the job's
    keys, the prefix, the window (s), the policies, and the job's set-up."""
    kw = json.loads(argv[1])
    return kw, int(argv[2]), float(argv[3]), float(argv[4]), argv[5].split(","), setup_for(kw)
