"""Run a set of policies on one setup and assemble the JSON document."""

from __future__ import annotations

import sys

from controlplane.sim.cluster import Simulation
from controlplane.sim.metrics import summarize
from controlplane.sim.policy_factory import make_policy
from controlplane.sim.scenarios import Setup, offered_load


def run_policies(
    setup: Setup,
    policies: list[str],
    seed: int = 0,
    progress: bool = False,
    options: dict[str, dict] | None = None,
    warmup_s: float = 0.0,
):
    """Run each policy (``options``: per-policy keyword arguments for ``make_policy``); TTFT
    figures leave out requests of the first ``warmup_s`` seconds (``metrics.summarize``)."""
    options = options or {}
    cfg, wl = setup.config, setup.workload
    cap = cfg.kv_capacity_blocks * cfg.block_bytes * cfg.engines
    results: dict = {}
    summary: dict = {}
    for name in policies:
        bar = _bar(name) if progress and len(wl) > 20_000 else None
        r = Simulation(cfg, wl, make_policy(name, **options.get(name, {})), seed=seed).run(
            progress=bar
        )
        results[name] = r
        summary[name] = summarize(r, cap, wl.duration_s, warmup_s)
    doc = {
        "workload": wl.name,
        "cluster": cfg.describe(),
        "assumptions": dict(setup.assumptions),
        "seed": seed,
        "duration_s": wl.duration_s,
        "warmup_s": warmup_s,
        "offered_load": offered_load(cfg, wl),
        "policies": summary,
    }
    return doc, results


def _bar(name: str):
    def show(i: int, n: int) -> None:
        done = int(30 * i / max(n, 1))
        sys.stderr.write(f"\r{name:<13}[{'#' * done}{'.' * (30 - done)}] {i}/{n}")
        if i >= n:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show
