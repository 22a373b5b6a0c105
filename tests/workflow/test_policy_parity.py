"""One policy, two adapters: the same cluster snapshot described by the simulator's adapter
(``controlplane.sim.adapter``, from simulated engines: FIFO queues, prefix caches, links) and by
the live control plane's (``replication.plans.inputs``, from what agents report: vLLM's waiting
and running requests and KV usage, jobs in flight, the residency index) gives the same engine
states and the same plan items, under both strategies: ``predictive`` on the snapshot's demand,
``reactive`` on the demand each side measures from the snapshot's arrivals (the simulator's
``reactive`` policy, ``sim.planned``; the live cycle's rule, ``plans.inputs.demand_of``). The
control tests give one adapter another input rule, or the simulated reactive another measure of
demand, and watch the comparison catch it.

Known limit, kept out of the snapshots: the live side cannot tell which cached blocks running
requests reference (vLLM reports only how many), so a forecast prefix is never referenced here.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from types import SimpleNamespace

import pytest

from controlplane.core.costmodel import TIER_BYTES_PER_S
from controlplane.core.policy.demand import MEASURE_WINDOW_S
from controlplane.core.policy.harm_guard import FLOOR, GuardState
from controlplane.core.policy.inputs import COLD_VALUE_S, engine_states
from controlplane.core.policy.strategy import STRATEGY_PREDICTIVE, STRATEGY_REACTIVE, plan_moves
from controlplane.core.policy.types import Candidate, Demand, Holding, Overrides
from controlplane.core.prefix_cache import PrefixCache
from controlplane.replication.plans import inputs as live
from controlplane.sim import adapter as simulated
from controlplane.sim.engine import SERVING, WARMING, Engine, OffloadTier
from controlplane.sim.planned import PlannedPolicy
from tests.planner_settings import uncharged
from wire.protocol import ENGINE_SERVING, ENGINE_WARMING, TIER_GPU

T = 1000.0  # the snapshot's time
BB = 2 << 20  # bytes per block
LINK = 1e9
LEAD = 90.0  # a joining engine serves this many seconds from now
H = 300.0


def snapshot(seed: int) -> dict:
    """A random cluster: per engine its lifecycle, requests, link backlog and cache."""
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    prefixes = [1000 + i for i in range(rng.randint(2, 10))]
    engines = []
    for i in range(n):
        warming = i > 0 and rng.random() < 0.25
        busy = not warming and rng.random() < 0.7
        capacity = rng.randint(24, 64)
        held = [k for k in prefixes if rng.random() < 0.4]
        referenced = rng.randint(1, 8) if busy else 0
        filler = rng.randint(0, capacity - len(held) - referenced - 1)
        engines.append(
            {
                "id": f"e{i}",
                "node": i // 2,
                "warming": warming,
                "capacity": capacity,
                "held": held,  # forecast prefixes cached there (one block each), unreferenced
                "filler": filler,  # other cached blocks, unreferenced, of no forecast value
                "referenced": referenced,  # blocks running or waiting requests use
                "waiting": rng.randint(0, 12) if busy else 0,
                "request_s": rng.choice([0.05, 0.2, 0.8]),
                "link_queued": rng.choice([0.0, 0.0, 2e8, 3e9]),
            }
        )
    if not any(e["held"] for e in engines if not e["warming"]):
        engines[0]["held"] = prefixes[:1]
    demand = {
        k: Demand(str(k), rng.uniform(0.0, 600.0), rng.uniform(0, 0.5), rng.uniform(0, 8), 1.0)
        for k in prefixes
    }
    cands = [Candidate(str(k), (k,), 16, BB, "t", 0.02, rng.uniform(0.001, 0.05)) for k in prefixes]
    # Arrivals of each prefix over the last 150 s: what reactive measures its demand from.
    arrivals = {
        k: sorted(rng.uniform(T - 150.0, T) for _ in range(rng.choice([0, 3, 40, 400])))
        for k in prefixes
    }
    return {
        "engines": engines,
        "demand": demand,
        "cands": cands,
        "load": rng.uniform(0, 0.9),
        "arrivals": arrivals,
    }


def holdings(snap) -> list[Holding]:
    return [Holding(str(k), e["id"], TIER_GPU) for e in snap["engines"] for k in e["held"]]


def value_of_block(snap):
    """The value the policy puts on a cached block: a forecast prefix's expected requests shared
    among its holders, times its recompute; nothing for the rest."""
    hold = holdings(snap)
    count = {c.prefix_id: sum(1 for h in hold if h.prefix_id == c.prefix_id) for c in snap["cands"]}
    by_key = {
        c.keys[0]: snap["demand"][c.keys[0]].expected_requests / count[c.prefix_id] * c.recompute_s
        for c in snap["cands"]
        if count[c.prefix_id]
    }
    return lambda k: by_key.get(k, 0.0)


def simulated_reports(snap):
    """The snapshot as simulated engines, described by the simulator's adapter."""
    engines = []
    for i, s in enumerate(snap["engines"]):
        cache = PrefixCache(s["capacity"])
        used = 10.0
        for j in range(s["filler"]):
            cache.use([50_000 + 1000 * i + j], used)
            used += 1.0
        for k in s["held"]:
            cache.use([k], used)
            used += 1.0
        queue: deque = deque()
        if s["referenced"]:
            # One running request (arrived at T - 5, finishing in a second), ``waiting`` behind
            # it; the blocks they use are referenced.
            finish = T + 1.0
            queue.append((T - 5.0, finish))
            for _ in range(s["waiting"]):
                finish += s["request_s"]
                queue.append((T - 4.0, finish))
            for j in range(s["referenced"]):
                cache.use([90_000 + 1000 * i + j], T - 5.0)
        e = Engine(
            i,
            s["node"],
            cache,
            tiers=[OffloadTier(name, PrefixCache(1), bw) for name, bw in TIER_BYTES_PER_S.items()],
            free_at=queue[-1][1] if queue else 0.0,
            link_free_at=T + s["link_queued"] / LINK,
            state=WARMING if s["warming"] else SERVING,
            queue=queue,
        )
        engines.append(e)
    sim = SimpleNamespace(
        engines=engines,
        serving=[e for e in engines if e.state == SERVING],
        block_bytes=BB,
        load=lambda t: snap["load"],
        config=SimpleNamespace(
            network_bytes_per_s=LINK,
            link_share_with_serving=0.0,
            changes=[SimpleNamespace(eid=e.eid, serve_s=T + LEAD) for e in engines],
        ),
    )
    reports = simulated.engine_reports(sim, T, value_of_block(snap), cold_value_s=COLD_VALUE_S)
    return reports, simulated.holdings(sim, snap["cands"], T)


def live_reports(snap, report=None):
    """The snapshot as its agents report it, described by the live control plane's adapter."""
    report = report or live.engine_report
    hold = holdings(snap)
    cached = live.cached_values(snap["cands"], list(snap["demand"].values()), hold)
    out = []
    for s in snap["engines"]:
        blocks = s["filler"] + len(s["held"]) + s["referenced"]
        metrics = {"kv_usage": s["referenced"] / s["capacity"]}
        if not s["warming"]:
            metrics |= {"waiting": s["waiting"], "running": snap["load"]}
        out.append(
            report(
                engine_id=s["id"],
                node=f"n{s['node']}",
                lifecycle=ENGINE_WARMING if s["warming"] else ENGINE_SERVING,
                capacity_bytes=float(s["capacity"] * BB),
                resident_bytes=float(blocks * BB),
                metrics=metrics,
                request_s=s["request_s"],
                spec_bytes=0.0,
                link_bytes_per_s=LINK,
                link_bytes_queued=s["link_queued"],
                cached=cached.get(s["id"], []),
                starts_serving_in_s=LEAD if s["warming"] else 0.0,
                default_load=0.5,
                slots=1.0,
            )
        )
    return out, hold


def simulated_reactive_demand(snap) -> list[Demand]:
    """The simulator's ``reactive`` policy fed the snapshot's arrivals: its demand at ``T``."""
    policy = PlannedPolicy(STRATEGY_REACTIVE, budgets=uncharged(horizon_s=H, min_confidence=0.0))
    policy.trackers, policy.short, policy.onset, policy.minute, policy.seen = {}, {}, {}, {}, {}
    for k, times in snap["arrivals"].items():
        for t in times:
            policy._observe(None, 0, t, k, (k,))
    return [dataclasses.replace(d, prefix_id=str(p)) for p, d in policy._demand(None, T, H).items()]


def live_reactive_demand(snap) -> list[Demand]:
    """The live plan cycle's reactive demand: each key's requests of the last minute
    (``plans.measured``) through the live rule (``plans.inputs.demand_of``)."""
    budgets = uncharged(horizon_s=H, min_confidence=0.0)
    out = []
    for k, times in snap["arrivals"].items():
        n = sum(1 for t in times if t > T - MEASURE_WINDOW_S)
        if n:
            out.append(live.demand_of(str(k), n / MEASURE_WINDOW_S, None, 0.0, budgets))
    return out


def hotter(snap: dict, factor: float = 100.0) -> dict:
    """The snapshot with its demand ``factor`` times higher: beyond what the holders serve, so
    serving engines take copies too (at the snapshot's demand only joining engines do, and the
    guard lets warm-ups through)."""
    demand = {
        k: dataclasses.replace(d, expected_requests=d.expected_requests * factor)
        for k, d in snap["demand"].items()
    }
    return {**snap, "demand": demand}


# The harm guard's allowances after harm (``core.policy.harm_guard``): half the engines cut to the floor,
# the snapshot's prefix group to half. Both adapters' plans go through ``plan_moves`` with it, the
# one shape the live cycle and the simulator apply it in.
CUT = GuardState(engines={f"e{i}": FLOOR for i in range(0, 8, 2)}, groups={"t": 0.5})


def plan_of(reports, hold, snap, strategy=STRATEGY_PREDICTIVE, demand=None, guard=None):
    budgets = uncharged(horizon_s=H, max_spec_vram_fraction=0.5, min_confidence=0.0)
    items = plan_moves(
        strategy=strategy,
        candidates=snap["cands"],
        demand=snap["demand"].values() if demand is None else demand,
        holdings=hold,
        engines=reports,
        budgets=budgets,
        overrides=Overrides(),
        guard=guard or GuardState(),
    ).items
    return [
        (i.prefix_id, i.source, i.target, i.tier, round(i.expected_ttft_saved_s, 6)) for i in items
    ]


def differences(seed: int, report=None) -> list[str]:
    snap = snapshot(seed)
    sim_reports, sim_hold = simulated_reports(snap)
    live_r, live_hold = live_reports(snap, report)
    out = []
    if sorted(sim_hold, key=repr) != sorted(live_hold, key=repr):
        out.append(f"holdings: {sim_hold} != {live_hold}")
    a = engine_states(sim_reports, horizon_s=H)
    b = engine_states(live_r, horizon_s=H)
    for x, y in zip(a, b, strict=True):
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if u != (pytest.approx(v, rel=1e-9, abs=1e-12) if isinstance(v, float) else v):
                out.append(f"seed {seed} {x.engine_id}.{f.name}: simulator {u} != live {v}")
    if plan_of(sim_reports, sim_hold, snap) != plan_of(live_r, live_hold, snap):
        out.append(f"seed {seed}: the plans differ")
    hot = hotter(snap)
    if plan_of(sim_reports, sim_hold, hot, guard=CUT) != plan_of(live_r, live_hold, hot, guard=CUT):
        out.append(f"seed {seed}: the guarded plans differ")
    sim_d, live_d = simulated_reactive_demand(snap), live_reactive_demand(snap)
    if sorted(sim_d, key=repr) != sorted(live_d, key=repr):
        out.append(f"seed {seed}: reactive demand: simulator {sim_d} != live {live_d}")
    a = plan_of(sim_reports, sim_hold, snap, STRATEGY_REACTIVE, sim_d)
    if a != plan_of(live_r, live_hold, snap, STRATEGY_REACTIVE, live_d):
        out.append(f"seed {seed}: the reactive plans differ")
    return out


SEEDS = range(60)


def test_both_adapters_give_the_same_engines_and_the_same_plan():
    diffs = [d for s in SEEDS for d in differences(s)]
    assert not diffs, diffs[:10]
    # The snapshots exercise what the rules decide: queues, link backlogs, joining engines,
    # displaced value, and plans with items.
    snaps = [snapshot(s) for s in SEEDS]
    assert any(e["waiting"] and e["link_queued"] for s in snaps for e in s["engines"])
    assert any(e["warming"] for s in snaps for e in s["engines"])
    planned = [plan_of(*live_reports(snapshot(s)), snapshot(s)) for s in SEEDS]
    assert sum(1 for p in planned if p) >= 10
    # ... and the guard's cut, the same on both sides, changes plans of the hotter snapshots.
    hot = [hotter(snapshot(s)) for s in SEEDS]
    cut = [plan_of(*live_reports(h), h, guard=CUT) != plan_of(*live_reports(h), h) for h in hot]
    assert sum(cut) >= 5
    reactive = [
        plan_of(
            *live_reports(snapshot(s)),
            snapshot(s),
            STRATEGY_REACTIVE,
            live_reactive_demand(snapshot(s)),
        )
        for s in SEEDS
    ]
    assert sum(1 for p in reactive if p) >= 10


def _kv_usage_as_load(**kw):
    """The old live rule: load from vLLM's KV usage (cache occupancy), not from requests."""
    m = dict(kw["metrics"])
    if "kv_usage" in m and kw["lifecycle"] == ENGINE_SERVING:
        m["running"] = m["kv_usage"]
    return live.engine_report(**{**kw, "metrics": m})


def _no_link_queue(**kw):
    """Copies in flight ignored: the link queue read as 0."""
    return live.engine_report(**{**kw, "link_bytes_queued": 0.0})


def _no_displaced_value(**kw):
    """The room's expected value ignored: every cached block free for the taking."""
    return live.engine_report(**{**kw, "cached": []})


@pytest.mark.parametrize("rule", [_kv_usage_as_load, _no_link_queue, _no_displaced_value])
def test_the_comparison_catches_an_adapter_with_another_input_rule(rule):
    diffs = [d for s in SEEDS for d in differences(s, rule)]
    assert diffs


def _measured_over_two_minutes(self, pid, t):
    """A simulated reactive that measures its demand over two minutes, not the live one."""
    times = [x for x in self.minute.get(pid, ()) if x > t - 120.0]
    return len(times), len(times) / 120.0


def test_the_comparison_catches_a_simulated_reactive_that_measures_demand_otherwise(monkeypatch):
    # Every arrival kept (the deque is trimmed to a minute as it is read): then a 2-minute rate.
    monkeypatch.setattr(PlannedPolicy, "measured", _measured_over_two_minutes)
    diffs = [d for s in SEEDS for d in differences(s)]
    assert any("reactive" in d for d in diffs)
