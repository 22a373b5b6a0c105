"""The simulator set-up of one grid job, for the diagnosis scripts next to this one: the keys of
a ``prewarm-sim grid`` job (model, scenario, seed, workload, tenants, load, engines, duration,
clients: a client half),
with that command's defaults, and the same window start for the fixed traces
(``controlplane.sim.seeds.run_one``)."""

import json
import math
import os

import numpy as np

from controlplane.sim.scenarios import build
from controlplane.sim.seeds import TRACE_SPAN_S, TRACE_WORKLOADS, WINDOW_STEP_S
from controlplane.sim.workloads.base import BLOCK_TOKENS


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
        clients=kw.get("clients", "all"),
    )


def prefix_window_args(argv: list[str]):
    """``JOB_JSON PREFIX T0 T1 POLICIES``, the arguments of the per-prefix probes: the job's
    keys, the prefix, the window (s), the policies, and the job's set-up."""
    kw = json.loads(argv[1])
    return kw, int(argv[2]), float(argv[3]), float(argv[4]), argv[5].split(","), setup_for(kw)


def scaleout_setup(kw: dict):
    """ServeGen on 70B, the scale-out unless ``kw`` names a scenario, 20 minutes unless it names a
    duration; the other keys go to ``build``. NOBAL=1 turns off the scale-out's ramp-in balance
    (``cfg.balance_wait_s``)."""
    setup = build(
        workload="servegen",
        scenario=kw.pop("scenario", "scaleout"),
        model="llama3-70b",
        duration=kw.pop("duration", 1200),
        **kw,
    )
    if os.environ.get("NOBAL"):
        setup.config.balance_wait_s = math.inf
    return setup


def prefix_tokens(wl) -> np.ndarray:
    """Each request's prefix length in tokens."""
    return np.array([len(p) * BLOCK_TOKENS for p in wl.prefixes])[wl.pid]
