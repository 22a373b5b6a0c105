"""This study diagnosis of a burst prefix on a worst seed: what scaled its holders, per policy.
Between T0 and T1 (s): every 10 s the engines holding the whole prefix and their queues; the
copies of it that were started and the ones refused for room (``start_copy`` returned None:
the target's free + displaceable room was smaller than the copy), by target; where the fair
reactive rule (which predictive keeps as its fallback) stopped on each of the prefix's arrivals
(holder wait <= 1 s, no target, an on-demand copy in flight, or the copy landing too late: the
holder's wait not above twice the copy time); and predictive's periodic plan rounds (the serving
engines' mean queue, over the 1 s back-off limit or not, and the copies each round started).
Usage: python -m experiments.speculation_tail.diag_fallback '{"seed":14,"scenario":"slowlink"}' 21 600 1200 \
    reactive,predictive
(keys as in a grid job: model, scenario, seed, workload, tenants, load, engines)."""

import math
import sys
from collections import Counter

import numpy as np

from controlplane.sim.cluster import Simulation
from controlplane.sim.policy_factory import make_policy
from experiments.speculation_tail.diag_setup import prefix_window_args

kw, PID, T0, T1, POLICIES, setup = prefix_window_args(sys.argv)


def cluster_queue(sim, t, pol):
    """The serving engines' mean queue as the planner reads it (the shared input rules)."""
    from controlplane.core.policy.backoff import cluster_queue_s
    from controlplane.core.policy.strategy import states_of
    from controlplane.sim import adapter
    from controlplane.sim.planned import COLD_VALUE_S

    reports = adapter.engine_reports(sim, t, pol.value_fn(sim, t), cold_value_s=COLD_VALUE_S)
    return cluster_queue_s(states_of(reports, horizon_s=pol.budgets.horizon_s))


seed = kw.get("seed", 0)
cfg, wl = setup.config, setup.workload


def rule_verdict(sim, pol, t, keys):
    """Where the fair reactive rule stops on this arrival: the steps of
    ``Reactive._maybe_copy`` (``controlplane/sim/policies.py``) redone without starting anything,
    so a probe can name the step (the rule itself returns nothing); kept in step by hand."""
    holder, best_m = None, 0
    for e in sim.serving:
        m = e.cache.match(keys)
        if m > best_m or (m == best_m and m and holder is not None and e.free_at < holder.free_at):
            holder, best_m = e, m
    if holder is None or best_m < pol.rule.min_blocks:
        return "no holder", None
    hw = holder.wait(t)
    if hw <= pol.rule.threshold_s:
        return "holder wait <= 1 s", None
    tgt, tw = None, hw
    for e in sim.serving:
        if e is holder or (PID, e.eid) in sim.in_flight:
            continue
        w = e.wait(t)
        if w < tw and e.cache.match(keys) < best_m:
            tgt, tw = e, w
    if tgt is None:
        return "no target", None
    missing = best_m - tgt.cache.match(keys[:best_m])
    land = sim.copy_eta(holder, tgt, missing * sim.block_bytes, t, speculative=False)
    if any(k[0] == PID for k in sim.demand_in_flight):
        return "on-demand copy in flight", None
    if not pol.rule.should_copy(hw, land - t, False):
        return "lands too late (holder wait <= 2x copy time)", (round(hw, 1), round(land - t, 1))
    return "copy tried", (round(hw, 1), round(land - t, 1))


for name in POLICIES:
    pol = make_policy(name)
    sim = Simulation(cfg, wl, pol, seed=seed)
    started, refused, verdicts, holders, rounds, example = [], Counter(), Counter(), {}, [], {}
    orig_copy = sim.start_copy

    def start_copy(
        pid,
        keys,
        src,
        dst,
        now,
        speculative,
        ttl_s=math.inf,
        value_of=None,
        budget=math.inf,
        keep_s=0.0,
        orig_copy=orig_copy,
        started=started,
        refused=refused,
    ):
        out = orig_copy(pid, keys, src, dst, now, speculative, ttl_s, value_of, budget, keep_s)
        if pid == PID and T0 <= now < T1:
            leased = sum(1 for _, u in dst.cache.pinned.items() if u > now)
            if out is None:
                refused[(dst.eid, f"{leased} leased blocks")] += 1
            else:
                started.append((round(now, 1), dst.eid, "spec" if speculative else "on-demand"))
        return out

    sim.start_copy = start_copy
    orig_route = pol.route

    def route(
        sim_,
        i,
        t,
        keys,
        orig_route=orig_route,
        holders=holders,
        verdicts=verdicts,
        example=example,
        pol=pol,
    ):
        if wl.pid[i] == PID and T0 <= t < T1:
            b = int(t // 10) * 10
            if b not in holders:
                holders[b] = [
                    (e.eid, round(e.wait(t), 1))
                    for e in sim_.serving
                    if e.cache.match(keys) == len(keys)
                ]
            v, detail = rule_verdict(sim_, pol, t, keys)
            verdicts[v] += 1
            if detail is not None:
                example.setdefault(int(t // 60), (v, detail))
        return orig_route(sim_, i, t, keys)

    pol.route = route
    if hasattr(pol, "_plan_round"):
        orig_round = pol._plan_round

        def plan_round(sim_, t, only=None, orig_round=orig_round, rounds=rounds, pol=pol):
            n0 = len(sim_.replicas)
            out = orig_round(sim_, t, only=only)
            if only is None and T0 <= t < T1:
                rounds.append(
                    (round(t), round(cluster_queue(sim_, t, pol), 2), len(sim_.replicas) - n0)
                )
            return out

        pol._plan_round = plan_round
    r = sim.run()
    p99 = float(np.percentile(r.ttft[r.arrivals >= 300], 99))
    print(f"{name}: p99 {p99:.2f} s (the probes only read: as in the grid)")
    print(f"   copies of prefix {PID} in {T0:.0f}-{T1:.0f} s started: {started}")
    print(f"   refused for room, by (target, leased blocks there): {refused.most_common(6)}")
    print(f"   the reactive rule on its arrivals: {dict(verdicts)}")
    print("   per minute, first (holder wait s, copy time s) the rule saw:", example)
    if rounds:
        over = sum(1 for r in rounds if r[1] > 1.0)
        print(
            f"   plan rounds: {len(rounds)}, {over} with the serving engines' mean queue > 1 s "
            f"(backed off), copies started by rounds {sum(r[2] for r in rounds)}; "
            f"(t, mean queue) every 4th: {[r[:2] for r in rounds[::4]]}"
        )
    for b in sorted(holders)[:: max(1, len(holders) // 12)]:
        print(f"   t {b}: holders (engine, queue s) {holders[b]}")
