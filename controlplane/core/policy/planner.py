"""The replication planner: what to copy where, and why.

The same function serves the Celery ``plan`` task, the simulator's ``predictive`` policy (fed
forecasts and burst risk) and its ``oracle`` (fed the true future arrivals). It knows nothing of
the simulator: callers describe prefixes, demand, residency, engines, budgets and overrides with
the dataclasses below, and get back ``PlannedMove`` s (a copy or a promotion each; the
Celery path stores them as ``replication.models.PlanItem`` rows).

Benefit model (all in seconds of TTFT, per planning horizon ``H``):
- A prefix ``p`` has per-request service time ``service_s`` where it is cached and
  ``recompute_s`` extra where it is not. Its demand rate to provision for is
  ``lam = expected/H + burst_probability * max(0, peak_rate - expected/H)``.
- Each engine ``e`` has spare capacity ``1 - load_e`` (engines warming up count with the load
  they will take). The holders of ``p`` can absorb ``sum(spare) / service_s`` requests/s of it
  at the target utilisation ``Budgets.target_utilisation``; the rest overflows.
- A replica on ``e`` serves ``min(overflow, spare_e / service_s) * H`` of the overflow, each
  saving ``recompute_s``; times ``confidence``. Its cost is the copy time (the link is shared
  with serving traffic) times ``Budgets.copy_cost_weight``.
- Prefixes held only on a lower tier (CPU, SSD) of an engine get a promotion item on that engine
  when demand is expected to reach it: the part of the prefix's rate its HBM holders (and the
  promotions already chosen) cannot take at the target utilisation, at least
  ``min_expected_hits`` requests in the horizon (the router prefers a copy already in HBM, so
  a promotion beside one is never used); the benefit is the promotion time a request would
  otherwise wait, for up to one request per horizon.
- Engines warming up (joining a scale-out, ``lifecycle="warming"``) will take their share
  (1/number of serving+warming engines) of every prefix's traffic once they serve, and the
  first request of a prefix there pays its full ``recompute_s``. A warm-up copy saves that with
  the probability that at least one such request arrives in the horizon after the engine
  starts: ``recompute_s * (1 - exp(-share * lam * H)) * confidence``, against the copy time.
  Warm-up copies may fill ``Budgets.max_warming_fraction`` of a joining engine (nothing else
  lives there yet; they turn into ordinary cache on first use).
- Speculation only where it is cheap and there is room to use it: no item targets an engine
  whose load exceeds ``Budgets.max_load`` (a busy engine has no spare capacity for the spilled
  requests, and at that load the serving traffic slows every copy), and no copy whose links are
  already busy (queued copies + this one) for more than half the horizon (it would land after
  the demand it is for). Where the planner plans nothing, the caller's reactive rule serves.
- Precision: with ``Budgets.min_expected_hits`` > 0, a replica (or warm-up copy) is planned
  only when that many requests are expected to use it in the horizon (1.6: P(used) >= 0.8).
- Room (``EngineState.free_bytes``) is what a replica may take without touching blocks that
  running or waiting requests reference: free blocks and cached blocks whose expected value over
  the horizon is below the replica's; the caller ranks them.
- What a speculative item takes from the cluster at the moment it runs: a request
  spilled to a replica waits the target's queue (``EngineState.queue_s``), so it saves
  ``recompute_s - queue_s``, not the recompute; a copy behind copies already queued on its links
  lands late and serves only the rest of the horizon (``1 - landing / H`` of its benefit); the
  room it takes holds expected value (``EngineState.displaced_s_per_byte``, seconds of prefill
  per byte of the room ``free_bytes`` counts), charged with the copy time. An item is planned
  only when benefit > cost x ``Budgets.min_benefit_ratio``. No item lands on a serving engine
  queueing more than ``Budgets.max_queue_s``, and while the serving engines queue more than
  ``Budgets.max_cluster_queue_s`` on average (``cluster_queue_s``) the planner backs off: warm-ups
  of joining engines only, and copies of a prefix whose own holders carry the queue (the serving
  engines that do not hold it queue under the limit, ``backs_off_around``): a burst that queues
  its holders is what a replica relieves, and it adds nothing to the engines that queue. The
  defaults (ratio 1, no queue limits, zero queue and displaced value) leave callers that do not
  pass these inputs as they were.
Each value is the model's terms (``core.policy.value``) times their correction from measured
outcomes (none given: the model as is). Greedy by net benefit; each chosen replica reduces the prefix's overflow and the target's spare
capacity, and re-enters the queue for a further replica. Budgets and overrides are hard limits.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from controlplane.core.policy.backoff import (
    backs_off,
    backs_off_around,
)
from controlplane.core.policy.targets import Targets, best_source, link_busy, link_wait
from controlplane.core.policy.types import (
    LIFECYCLES,
    Budgets,
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
    PlannedMove,
)
from controlplane.core.policy.value import NONE as NO_CALIBRATION
from controlplane.core.policy.value import PROMOTION, REPLICA, WARM_UP, Calibration, ValueTerms
from wire.protocol import ENGINE_DRAINING, ENGINE_SERVING, ENGINE_WARMING, TIER_GPU

__all__ = ["lam_text", "plan"]


@dataclass
class _Round:
    """One plan's working state: the inputs indexed, and what the stages have used up so far."""

    budgets: Budgets
    overrides: Overrides
    engines: Sequence[EngineState]
    candidates: Sequence[Candidate]
    cands: dict[str, Candidate]
    dem: dict[str, Demand]
    by_engine: dict[str, EngineState]
    gpu_holders: dict[str, list[str]]
    lower: dict[str, list[tuple[str, str]]]
    allowed: set[str]
    spare: dict[str, float]
    room: dict[str, float]
    bytes_left: float
    backoff: bool
    items: list[PlannedMove] = field(default_factory=list)
    promoted: dict[str, set[str]] = field(default_factory=dict)  # prefix -> engines promoted on
    warmed: dict[str, set[str]] = field(default_factory=dict)  # prefix -> engines warmed
    # The value model's correction from measured outcomes (``core.policy.value``).
    calibration: Calibration = NO_CALIBRATION

    def eligible(self, c: Candidate, d: Demand | None) -> bool:
        if c.prefix_id in self.overrides.pinned:
            return True
        return (
            d is not None
            and d.confidence >= self.budgets.min_confidence
            and d.expected_requests > 0
        )


def plan(
    candidates: Sequence[Candidate],
    demand: Iterable[Demand],
    holdings: Iterable[Holding],
    engines: Sequence[EngineState],
    budgets: Budgets | None = None,
    overrides: Overrides | None = None,
    calibration: Calibration | None = None,
) -> list[PlannedMove]:
    """Plan items, best first, within ``budgets`` and ``overrides``: promotions from lower
    tiers, then warm-ups of joining engines, then replicas greedy by net benefit. Each item's
    value is the model's, corrected by ``calibration`` (``core.policy.value``)."""
    budgets = budgets or Budgets()
    overrides = overrides or Overrides()
    if overrides.frozen:
        return []
    r = _index(candidates, demand, holdings, engines, budgets, overrides)
    r.calibration = calibration or NO_CALIBRATION
    if not r.backoff:
        _promote(r)
    _warm_up(r)
    _replicate(r)
    return r.items


def _index(candidates, demand, holdings, engines, budgets, overrides) -> _Round:
    """Stage 1: index the inputs; the engines a speculative item may target, their spare
    capacity and room; whether the cluster's queue holds speculation back."""
    by_engine = {e.engine_id: e for e in engines}
    for e in engines:
        if e.lifecycle not in LIFECYCLES:
            raise ValueError(f"engine {e.engine_id}: unknown lifecycle {e.lifecycle!r}")
    gpu_holders: dict[str, list[str]] = {}
    lower: dict[str, list[tuple[str, str]]] = {}
    for h in holdings:
        if h.engine_id not in by_engine:
            continue
        if h.tier == TIER_GPU:
            gpu_holders.setdefault(h.prefix_id, []).append(h.engine_id)
        else:
            lower.setdefault(h.prefix_id, []).append((h.engine_id, h.tier))
    allowed = {
        e.engine_id
        for e in engines
        if e.engine_id not in overrides.excluded_engines
        and e.node not in overrides.excluded_nodes
        and e.lifecycle != ENGINE_DRAINING
        and e.load <= budgets.max_load
        and (e.lifecycle != ENGINE_SERVING or e.queue_s <= budgets.max_queue_s)
    }
    room = {
        e.engine_id: max(
            0.0,
            min(e.free_bytes, budgets.spec_cap_bytes(e.kv_capacity_bytes) - e.spec_bytes),
        )
        for e in engines
    }
    return _Round(
        budgets=budgets,
        overrides=overrides,
        engines=engines,
        candidates=candidates,
        cands={c.prefix_id: c for c in candidates},
        dem={d.prefix_id: d for d in demand},
        by_engine=by_engine,
        gpu_holders=gpu_holders,
        lower=lower,
        allowed=allowed,
        spare={e.engine_id: max(0.0, 1.0 - e.load) for e in engines},
        room=room,
        bytes_left=budgets.max_bytes_per_interval,
        # Back off while the cluster queues: only warm-ups of joining engines (which take no
        # traffic yet, so their room and queue cost nothing) are planned, and the copies
        # ``backs_off_around`` lets through.
        backoff=backs_off(engines, budgets),
    )


def _promote(r: _Round) -> None:
    """Stage 2: promotions from lower tiers (cheap, local, and they free the link for copies)."""
    b, H = r.budgets, r.budgets.horizon_s
    for pid, rows in r.lower.items():
        c = r.cands.get(pid)
        d = r.dem.get(pid)
        if c is None or not r.eligible(c, d):
            continue
        held = set(r.gpu_holders.get(pid, ()))
        # Requests reach a lower-tier copy only where the HBM holders (and the promotions
        # this plan adds) cannot take them: the router prefers a copy already in HBM.
        lam = _rate(d, H) if d else 0.0
        per_s = b.target_utilisation / c.service_s if c.service_s > 0 else math.inf
        cap = sum(r.spare.get(h, 0.0) for h in held if h in r.by_engine) * per_s
        for eid, tier in rows:
            e = r.by_engine[eid]
            bw = e.tier_bytes_per_s.get(tier, 0.0)
            if eid in held or eid not in r.allowed or bw <= 0 or r.room[eid] < c.nbytes:
                continue
            promo_s = c.nbytes / bw
            conf = d.confidence if d else 1.0
            reach = max(0.0, lam - cap) * H if d else 1.0
            if pid in r.overrides.pinned:
                reach = max(reach, 1.0)
            elif reach <= 0 or reach < b.min_expected_hits:
                continue
            # reach > 0 here: up to one request waits the promotion (module doc)
            terms = ValueTerms(
                PROMOTION, reach, min(promo_s, c.recompute_s) * min(1.0, reach) / reach, conf
            )
            benefit = r.calibration.value(terms)
            cost = c.nbytes * e.displaced_s_per_byte * b.min_benefit_ratio
            if benefit <= cost or c.nbytes > r.bytes_left:
                continue
            r.room[eid] -= c.nbytes
            r.bytes_left -= c.nbytes
            held.add(eid)
            r.promoted.setdefault(pid, set()).add(eid)
            cap += r.spare[eid] * per_s
            start = max(0.0, (d.first_arrival_s if d else 0.0) - 2.0 * promo_s)
            why = (
                f"promote from {tier} ahead of ~{reach:.1f} requests expected to "
                f"reach it ({promo_s:.2f} s at tier bandwidth)"
            )
            r.items.append(
                PlannedMove(
                    pid, c.keys, eid, eid, tier, c.nbytes, start, benefit, 0.0, conf, why, terms
                )
            )


def _warm_up(r: _Round) -> None:
    """Stage 3: warm-up copies to engines that start serving within the horizon (module doc)."""
    b, H = r.budgets, r.budgets.horizon_s
    by_engine = r.by_engine
    active = sum(1 for e in by_engine.values() if e.lifecycle in (ENGINE_SERVING, ENGINE_WARMING))
    for e in by_engine.values():
        if e.lifecycle != ENGINE_WARMING or e.engine_id not in r.allowed:
            continue
        if e.starts_serving_in_s > H:
            continue
        cap = b.max_warming_fraction * e.kv_capacity_bytes - e.spec_bytes
        left = max(0.0, min(e.free_bytes, cap))
        rows = []
        for c in r.candidates:
            d = r.dem.get(c.prefix_id)
            holders = r.gpu_holders.get(c.prefix_id)
            if d is None or not holders or not r.eligible(c, d) or e.engine_id in holders:
                continue
            src = by_engine[best_source([h for h in holders if h in by_engine], by_engine, e)]
            copy_s = c.nbytes / max(1.0, min(e.link_bytes_per_s, src.link_bytes_per_s))
            x = _rate(d, H) * H / max(1, active)
            if x < b.min_expected_hits:
                continue
            if x <= 0:
                continue  # no request expected there: nothing to save
            # The first request there saves its recompute: spread over the x expected.
            terms = ValueTerms(WARM_UP, x, c.recompute_s * (1.0 - math.exp(-x)) / x, d.confidence)
            benefit = r.calibration.value(terms)
            cost = copy_s * b.copy_cost_weight + c.nbytes * e.displaced_s_per_byte
            net = benefit - cost * b.min_benefit_ratio
            if net > 0 and not link_busy(src, e, copy_s, H):
                rows.append((net, c.prefix_id, c, d, src, copy_s, benefit, x, terms))
        rows.sort(key=lambda row: (-row[0], row[1]))
        for _, pid, c, d, src, copy_s, benefit, x, terms in rows:
            if c.nbytes > left or c.nbytes > r.bytes_left:
                continue
            left -= c.nbytes
            r.bytes_left -= c.nbytes
            r.room[e.engine_id] = max(0.0, r.room[e.engine_id] - c.nbytes)
            r.warmed.setdefault(pid, set()).add(e.engine_id)
            why = (
                f"warm {e.engine_id} before it serves (in {e.starts_serving_in_s:.0f} s): "
                f"~{x:.1f} requests of it expected there in {H:.0f} s, the first would "
                f"recompute {c.recompute_s:.2f} s; copy {copy_s:.2f} s"
            )
            r.items.append(
                PlannedMove(
                    pid,
                    c.keys,
                    src.engine_id,
                    e.engine_id,
                    TIER_GPU,
                    c.nbytes,
                    0.0,
                    benefit,
                    copy_s,
                    d.confidence,
                    why,
                    terms,
                )
            )


def _overflowing(r: _Round) -> tuple[list[tuple[float, int, str]], dict[str, list]]:
    """Stage 4: the prefixes whose demand overflows their holders (and the engines this plan
    promotes or warms them on), as a heap of their next replica by its value."""
    b, H = r.budgets, r.budgets.horizon_s
    heap: list[tuple[float, int, str]] = []
    state: dict[str, list] = {}
    for seq, c in enumerate(r.candidates):
        d = r.dem.get(c.prefix_id)
        if not r.eligible(c, d) or c.service_s <= 0:
            continue
        holders = [h for h in r.gpu_holders.get(c.prefix_id, ()) if h in r.by_engine]
        if not holders:
            continue  # nothing to copy from (a cold prefix is computed where it lands)
        if r.backoff and backs_off_around(r.engines, b, holders):
            continue
        lam = _rate(d, H) if d else 0.0
        # Engines this plan promotes it on hold it too (no copy to them, their capacity counts).
        up = r.promoted.get(c.prefix_id, set())
        cap = sum(r.spare[h] for h in set(holders) | up) / c.service_s * b.target_utilisation
        overflow = lam - cap
        if overflow <= 0 and c.prefix_id not in r.overrides.pinned:
            continue
        state[c.prefix_id] = [
            max(overflow, 0.0),
            set(holders) | up | r.warmed.get(c.prefix_id, set()),
            0,
        ]
        heapq.heappush(heap, (-c.recompute_s * max(overflow, 1e-9), seq, c.prefix_id))
    return heap, state


def _replicate(r: _Round) -> None:
    """Stage 5: replicas, greedy by net benefit. Each reduces its prefix's overflow and its
    target's spare capacity, and re-enters the heap for a further replica."""
    b, H = r.budgets, r.budgets.horizon_s
    heap, state = _overflowing(r)
    seq = len(r.candidates)
    queued: dict[str, float] = {}  # seconds of this plan's copies on each engine's link
    targets = Targets(r.allowed, r.room, r.spare, r.by_engine)
    while heap:
        _, _, pid = heapq.heappop(heap)
        c, d = r.cands[pid], r.dem.get(pid)
        overflow, holders, count = state[pid]
        if count >= b.max_replicas_per_prefix or c.nbytes > r.bytes_left:
            continue
        best = targets.best(c.nbytes, holders)
        if best is None:
            continue
        item = _replica(r, c, d, overflow, best, queued)
        if item is None:
            continue
        src, served = item.source, item_served(r, c, overflow, best)
        copy_s = _copy_s(r, c, r.by_engine[src], r.by_engine[best])
        r.room[best] -= c.nbytes
        queued[src] = queued.get(src, 0.0) + copy_s
        queued[best] = queued.get(best, 0.0) + copy_s
        r.bytes_left -= c.nbytes
        targets.set_spare(best, max(0.0, r.spare[best] - served / H * c.service_s))
        holders.add(best)
        state[pid] = [overflow - served / H, holders, count + 1]
        r.items.append(item)
        if state[pid][0] > 1e-9:
            heapq.heappush(heap, (-c.recompute_s * state[pid][0], seq, pid))
            seq += 1


def item_served(r: _Round, c: Candidate, overflow: float, target: str) -> float:
    """Requests of ``c`` expected to spill to a replica on ``target`` in the horizon."""
    b = r.budgets
    served = min(overflow, r.spare[target] / c.service_s * b.target_utilisation) * b.horizon_s
    return max(served, 1.0) if c.prefix_id in r.overrides.pinned else served


def _copy_s(r: _Round, c: Candidate, src: EngineState, dst: EngineState) -> float:
    return c.nbytes / max(1.0, min(dst.link_bytes_per_s, src.link_bytes_per_s))


def _replica(
    r: _Round, c: Candidate, d: Demand | None, overflow: float, best: str, queued: dict
) -> PlannedMove | None:
    """One replica of ``c`` on ``best`` where what it saves beats what it takes, else None."""
    b, H = r.budgets, r.budgets.horizon_s
    pid, tgt = c.prefix_id, r.by_engine[best]
    pinned = pid in r.overrides.pinned
    # Copy only from engines that hold it now, not from replicas this plan adds; spread over
    # them by when each link is free (this plan's own copies included).
    src = best_source(r.gpu_holders[pid], r.by_engine, tgt, queued)
    conf = d.confidence if d else 1.0
    served = item_served(r, c, overflow, best)
    if not pinned and served < b.min_expected_hits:
        return None
    copy_s = _copy_s(r, c, r.by_engine[src], tgt)
    # What the copy takes, at the moment it runs: requests spilled to the target wait its
    # queue (they save the recompute less that wait); a copy behind a busy link lands late
    # and serves only the rest of the horizon; the room it takes holds expected value.
    land_s = link_wait(r.by_engine[src], tgt, queued) + copy_s
    per_request = max(0.0, c.recompute_s - tgt.queue_s)
    terms = ValueTerms(REPLICA, served, per_request, conf * max(0.0, 1.0 - land_s / H))
    benefit = r.calibration.value(terms)
    cost = copy_s * b.copy_cost_weight + c.nbytes * tgt.displaced_s_per_byte
    if not pinned and benefit - cost * b.min_benefit_ratio <= 0:
        return None
    if not pinned and link_busy(r.by_engine[src], tgt, copy_s, H, queued):
        return None
    lead = tgt.starts_serving_in_s if tgt.lifecycle == ENGINE_WARMING else 0.0
    first = max(lead, d.first_arrival_s if d else 0.0)
    start = max(0.0, first - 2.0 * copy_s)
    why = (
        f"{'pinned; ' if pinned else ''}"
        f"{lam_text(d, H)} overflows its holders by "
        f"{overflow:.2f}/s; {served:.1f} requests expected to spill to "
        f"{best}{f' (joins in {lead:.0f} s)' if lead else ''}, each saving "
        f"{c.recompute_s:.2f} s of prefill; copy {copy_s:.2f} s"
    )
    return PlannedMove(
        pid, c.keys, src, best, TIER_GPU, c.nbytes, start, benefit, cost, conf, why, terms
    )


def _rate(d: Demand, horizon: float) -> float:
    mean = d.expected_requests / horizon
    return mean + d.burst_probability * max(0.0, d.peak_rate - mean)


def lam_text(d: Demand | None, horizon: float) -> str:
    if d is None:
        return "pinned prefix"
    return (
        f"demand {d.expected_requests:.1f} requests in {horizon:.0f} s "
        f"(burst p={d.burst_probability:.2f} to {d.peak_rate:.2f}/s)"
    )
