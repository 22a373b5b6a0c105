"""Run a set of policies on one setup and assemble the JSON document."""

from __future__ import annotations

import sys
from dataclasses import replace

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
    # The hindsight bound needs its candidates' runs: run them first (once each).
    order = list(policies)
    if "oracle" in order:
        order.remove("oracle")
        for cand in BOUND_OF:
            if cand not in order:
                order.append(cand)
        order.append("oracle")
    for name in order:
        if name == "oracle":
            r, s = _hindsight(results, summary)
        else:
            bar = _bar(name) if progress and len(wl) > 20_000 else None
            r = Simulation(cfg, wl, make_policy(name, **options.get(name, {})), seed=seed).run(
                progress=bar
            )
            s = summarize(r, cap, wl.duration_s, warmup_s)
        results[name] = r
        summary[name] = s
    results = {n: results[n] for n in policies}
    summary = {n: summary[n] for n in policies}
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


# ``oracle``, the hindsight bound: of the schedules the planner can follow on this draw (its own
# causal one, ``predictive``; the ``clairvoyant`` one, fed the true arrivals of every coming
# horizon and re-planned on every arrival), the one whose measured p99 TTFT turns out best,
# which only the whole trace tells. Same budgets, placement, retention and fallback.
BOUND_OF = ("clairvoyant", "predictive")


def hindsight_summary(summary: dict) -> tuple[str, dict]:
    """The bound's policy and its summary, from the summaries of every policy in ``BOUND_OF``."""
    best = min(BOUND_OF, key=lambda n: (summary[n]["ttft_p99_s"], summary[n]["ttft_mean_s"]))
    return best, {**summary[best], "bound_of": list(BOUND_OF), "bound_chosen": best}


def _hindsight(results: dict, summary: dict):
    best, s = hindsight_summary(summary)
    return replace(results[best], policy="oracle"), s


def _bar(name: str):
    def show(i: int, n: int) -> None:
        done = int(30 * i / max(n, 1))
        sys.stderr.write(f"\r{name:<13}[{'#' * done}{'.' * (30 - done)}] {i}/{n}")
        if i >= n:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show
