"""The replication planner (architecture section 5, step 3): what to copy where, and why.

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
  the horizon is below the replica's (architecture section 5); the caller ranks them.
- What a speculative item takes from the cluster at the moment it runs (issue 20): a request
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
Greedy by net benefit; each chosen replica reduces the prefix's overflow and the target's spare
capacity, and re-enters the queue for a further replica. Budgets and overrides are hard limits.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from controlplane.core.protocol import (
    ENGINE_DRAINING,
    ENGINE_LIFECYCLES,
    ENGINE_SERVING,
    ENGINE_WARMING,
    TIER_GPU,
)

LIFECYCLES = ENGINE_LIFECYCLES

# The charged planner's settings, one set for every trace and cell (docs/simulator.md, "Issue 20
# runs"): the simulator's ``predictive`` and ``oracle`` use them, and so does a new
# ``replication.models.Policy`` (an operator tunes them there). A speculative item's expected
# saving must be BENEFIT_MARGIN x what it takes (copy time, the displaced blocks' expected value,
# the target's queue); none lands on a serving engine queueing over MAX_TARGET_QUEUE_S; while the
# serving engines queue MAX_CLUSTER_QUEUE_S on average the planner backs off (warm-ups of joining
# engines, and copies of a prefix whose holders alone carry the queue).
BENEFIT_MARGIN = 2.0
MAX_TARGET_QUEUE_S = 2.0
MAX_CLUSTER_QUEUE_S = 1.0


@dataclass(frozen=True)
class Candidate:
    """A prefix that could be replicated: its chain of canonical keys (root first)."""

    prefix_id: str
    keys: tuple[int, ...]
    tokens: int
    nbytes: int
    workload_key: str
    service_s: float  # prefill time of one request with the prefix cached
    recompute_s: float  # extra prefill time when the prefix is not cached


@dataclass(frozen=True)
class Demand:
    prefix_id: str
    expected_requests: float  # in the horizon
    burst_probability: float = 0.0
    peak_rate: float = 0.0  # requests/s a burst would reach
    confidence: float = 1.0
    first_arrival_s: float = 0.0  # seconds from now to the first expected request


@dataclass(frozen=True)
class Holding:
    prefix_id: str
    engine_id: str
    tier: str = TIER_GPU  # protocol tier names: TIER_GPU, TIER_CPU, TIER_DISK


@dataclass(frozen=True)
class EngineState:
    engine_id: str
    node: str
    kv_capacity_bytes: float
    free_bytes: float  # room for speculative replicas: free + unreferenced cold blocks
    spec_bytes: float  # speculative replicas held now
    link_bytes_per_s: float  # effective, net of serving traffic
    load: float  # 0..1 utilisation (expected, for a warming engine)
    lifecycle: str = ENGINE_SERVING
    starts_serving_in_s: float = 0.0
    tier_bytes_per_s: dict[str, float] = field(default_factory=dict)  # promotion bandwidth
    link_queue_s: float = 0.0  # seconds of copies already queued on this engine's link
    # What a speculative item takes from the cluster where it lands (defaults: nothing known).
    queue_s: float = 0.0  # requests already queued on this engine: seconds until it frees up
    displaced_s_per_byte: float = 0.0  # expected prefill seconds the room in free_bytes holds


@dataclass(frozen=True)
class Budgets:
    max_spec_vram_fraction: float = 0.10
    max_bytes_per_interval: float = float("inf")
    min_confidence: float = 0.5
    ttl_s: float = 600.0
    horizon_s: float = 300.0
    target_utilisation: float = 0.8
    copy_cost_weight: float = 1.0
    max_replicas_per_prefix: int = 64
    max_warming_fraction: float = 0.5
    max_load: float = 0.7  # no speculative item targets an engine busier than this
    # A replica (or warm-up copy) is planned only when at least this many requests are expected
    # to use it in the horizon: 1.6 makes P(used at least once) >= 0.8 for Poisson arrivals.
    min_expected_hits: float = 0.0
    # Cost-charged speculation (``charged_plan``; the defaults leave ``plan`` as it was):
    # benefit must exceed cost x ``min_benefit_ratio``; no speculative copy lands on a serving
    # engine queueing longer than ``max_queue_s``, and none at all (warm-ups of joining engines
    # aside) while the serving engines queue ``max_cluster_queue_s`` on average.
    min_benefit_ratio: float = 1.0
    max_queue_s: float = math.inf
    max_cluster_queue_s: float = math.inf

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_spec_vram_fraction <= 1.0:
            raise ValueError("max_spec_vram_fraction must be in [0, 1]")
        if not 0.0 <= self.max_warming_fraction <= 1.0:
            raise ValueError("max_warming_fraction must be in [0, 1]")
        if self.horizon_s <= 0 or self.ttl_s <= 0:
            raise ValueError("horizon_s and ttl_s must be > 0")
        if self.max_bytes_per_interval < 0:
            raise ValueError("max_bytes_per_interval must be >= 0")
        if not 0.0 < self.max_load <= 1.0:
            raise ValueError("max_load must be in (0, 1]")
        if not self.min_expected_hits >= 0.0:
            raise ValueError("min_expected_hits must be >= 0")
        if not self.min_benefit_ratio >= 1.0:
            raise ValueError("min_benefit_ratio must be >= 1")
        if not (self.max_queue_s >= 0.0 and self.max_cluster_queue_s >= 0.0):
            raise ValueError("max_queue_s and max_cluster_queue_s must be >= 0")


@dataclass(frozen=True)
class Overrides:
    pinned: frozenset[str] = frozenset()  # planned whatever their confidence
    excluded_engines: frozenset[str] = frozenset()
    excluded_nodes: frozenset[str] = frozenset()
    frozen: bool = False  # plan nothing


@dataclass(frozen=True)
class PlannedMove:
    prefix_id: str
    keys: tuple[int, ...]
    source: str  # engine id holding it (the target itself for a promotion)
    target: str
    tier: str  # the tier it comes from: TIER_GPU (a copy) or TIER_CPU/TIER_DISK (a promotion)
    nbytes: int
    start_in_s: float  # when to start, from now (ahead of the forecast burst)
    expected_ttft_saved_s: float
    cost_s: float
    confidence: float
    reason: str


def plan(
    candidates: Sequence[Candidate],
    demand: Iterable[Demand],
    holdings: Iterable[Holding],
    engines: Sequence[EngineState],
    budgets: Budgets | None = None,
    overrides: Overrides | None = None,
) -> list[PlannedMove]:
    """Plan items, best first, within ``budgets`` and ``overrides``."""
    budgets = budgets or Budgets()
    overrides = overrides or Overrides()
    if overrides.frozen:
        return []
    H = budgets.horizon_s
    dem = {d.prefix_id: d for d in demand}
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
    # Back off while the cluster queues: only warm-ups of joining engines (which take no
    # traffic yet, so their room and queue cost nothing) are planned.
    backoff = backs_off(engines, budgets)
    spare = {e.engine_id: max(0.0, 1.0 - e.load) for e in engines}
    room = {
        e.engine_id: max(
            0.0,
            min(e.free_bytes, budgets.max_spec_vram_fraction * e.kv_capacity_bytes - e.spec_bytes),
        )
        for e in engines
    }
    bytes_left = budgets.max_bytes_per_interval
    items: list[PlannedMove] = []
    cands = {c.prefix_id: c for c in candidates}
    promoted: dict[str, set[str]] = {}  # engines this plan promotes each prefix on

    def eligible(c: Candidate, d: Demand | None) -> bool:
        if c.prefix_id in overrides.pinned:
            return True
        return d is not None and d.confidence >= budgets.min_confidence and d.expected_requests > 0

    # Promotions from lower tiers first: cheap, local, and they free the link for copies.
    for pid, rows in [] if backoff else lower.items():
        c = cands.get(pid)
        d = dem.get(pid)
        if c is None or not eligible(c, d):
            continue
        held = set(gpu_holders.get(pid, ()))
        # Requests reach a lower-tier copy only where the HBM holders (and the promotions
        # this plan adds) cannot take them: the router prefers a copy already in HBM.
        lam = _rate(d, H) if d else 0.0
        per_s = budgets.target_utilisation / c.service_s if c.service_s > 0 else math.inf
        cap = sum(spare.get(h, 0.0) for h in held if h in by_engine) * per_s
        for eid, tier in rows:
            e = by_engine[eid]
            bw = e.tier_bytes_per_s.get(tier, 0.0)
            if eid in held or eid not in allowed or bw <= 0 or room[eid] < c.nbytes:
                continue
            promo_s = c.nbytes / bw
            conf = d.confidence if d else 1.0
            reach = max(0.0, lam - cap) * H if d else 1.0
            if pid in overrides.pinned:
                reach = max(reach, 1.0)
            elif reach <= 0 or reach < budgets.min_expected_hits:
                continue
            benefit = min(promo_s, c.recompute_s) * min(1.0, reach) * conf
            cost = c.nbytes * e.displaced_s_per_byte * budgets.min_benefit_ratio
            if benefit <= cost or c.nbytes > bytes_left:
                continue
            room[eid] -= c.nbytes
            bytes_left -= c.nbytes
            held.add(eid)
            promoted.setdefault(pid, set()).add(eid)
            cap += spare[eid] * per_s
            start = max(0.0, (d.first_arrival_s if d else 0.0) - 2.0 * promo_s)
            items.append(
                PlannedMove(
                    pid,
                    c.keys,
                    eid,
                    eid,
                    tier,
                    c.nbytes,
                    start,
                    benefit,
                    0.0,
                    conf,
                    f"promote from {tier} ahead of ~{reach:.1f} requests expected to "
                    f"reach it ({promo_s:.2f} s at tier bandwidth)",
                )
            )

    bytes_left, warm = _warm_up(
        candidates, dem, gpu_holders, by_engine, allowed, room, budgets, eligible, bytes_left
    )
    items.extend(warm)
    warmed: dict[str, set[str]] = {}
    for it in warm:
        warmed.setdefault(it.prefix_id, set()).add(it.target)

    # Replicas: a heap of the next replica of each prefix with overflow.
    heap: list[tuple[float, int, str]] = []
    queued: dict[str, float] = {}  # seconds of this plan's copies on each engine's link
    state: dict[str, list] = {}
    seq = 0
    for c in candidates:
        d = dem.get(c.prefix_id)
        if not eligible(c, d) or c.service_s <= 0:
            continue
        holders = [h for h in gpu_holders.get(c.prefix_id, ()) if h in by_engine]
        if not holders:
            continue  # nothing to copy from (a cold prefix is computed where it lands)
        if backoff and backs_off_around(engines, budgets, holders):
            continue
        lam = _rate(d, H) if d else 0.0
        # Engines this plan promotes it on hold it too (no copy to them, their capacity counts).
        up = promoted.get(c.prefix_id, set())
        cap = sum(spare[h] for h in set(holders) | up) / c.service_s * budgets.target_utilisation
        overflow = lam - cap
        pinned = c.prefix_id in overrides.pinned
        if overflow <= 0 and not pinned:
            continue
        state[c.prefix_id] = [
            max(overflow, 0.0),
            set(holders) | up | warmed.get(c.prefix_id, set()),
            0,
        ]
        heapq.heappush(heap, (-c.recompute_s * max(overflow, 1e-9), seq, c.prefix_id))
        seq += 1

    targets = _Targets(allowed, room, spare, by_engine)
    while heap:
        _, _, pid = heapq.heappop(heap)
        c = cands[pid]
        d = dem.get(pid)
        overflow, holders, count = state[pid]
        if count >= budgets.max_replicas_per_prefix or c.nbytes > bytes_left:
            continue
        best = targets.best(c.nbytes, holders)
        if best is None:
            continue
        tgt = by_engine[best]
        # Copy only from engines that hold it now, not from replicas this plan adds; spread
        # over them by when each link is free (this plan's own copies included).
        src = _best_source(gpu_holders[pid], by_engine, tgt, queued)
        conf = d.confidence if d else 1.0
        served = min(overflow, spare[best] / c.service_s * budgets.target_utilisation) * H
        if pid in overrides.pinned:
            served = max(served, 1.0)
        elif served < budgets.min_expected_hits:
            continue
        copy_s = c.nbytes / max(1.0, min(tgt.link_bytes_per_s, by_engine[src].link_bytes_per_s))
        # What the copy takes, at the moment it runs: requests spilled to the target wait its
        # queue (they save the recompute less that wait); a copy behind a busy link lands late
        # and serves only the rest of the horizon; the room it takes holds expected value.
        land_s = _link_wait(by_engine[src], tgt, queued) + copy_s
        per_request = max(0.0, c.recompute_s - tgt.queue_s)
        benefit = served * per_request * conf * max(0.0, 1.0 - land_s / H)
        cost = copy_s * budgets.copy_cost_weight + c.nbytes * tgt.displaced_s_per_byte
        if benefit - cost * budgets.min_benefit_ratio <= 0 and pid not in overrides.pinned:
            continue
        if _link_busy(by_engine[src], tgt, copy_s, H, queued) and pid not in overrides.pinned:
            continue
        room[best] -= c.nbytes
        queued[src] = queued.get(src, 0.0) + copy_s
        queued[best] = queued.get(best, 0.0) + copy_s
        bytes_left -= c.nbytes
        targets.set_spare(best, max(0.0, spare[best] - served / H * c.service_s))
        holders.add(best)
        state[pid] = [overflow - served / H, holders, count + 1]
        lead = tgt.starts_serving_in_s if tgt.lifecycle == ENGINE_WARMING else 0.0
        first = max(lead, d.first_arrival_s if d else 0.0)
        start = max(0.0, first - 2.0 * copy_s)
        why = (
            f"{'pinned; ' if pid in overrides.pinned else ''}"
            f"{lam_text(d, H)} overflows its holders by "
            f"{overflow:.2f}/s; {served:.1f} requests expected to spill to "
            f"{best}{f' (joins in {lead:.0f} s)' if lead else ''}, each saving "
            f"{c.recompute_s:.2f} s of prefill; copy {copy_s:.2f} s"
        )
        items.append(
            PlannedMove(pid, c.keys, src, best, TIER_GPU, c.nbytes, start, benefit, cost, conf, why)
        )
        if state[pid][0] > 1e-9:
            heapq.heappush(heap, (-c.recompute_s * state[pid][0], seq, pid))
            seq += 1
    return items


def _warm_up(candidates, dem, gpu_holders, by_engine, allowed, room, budgets, eligible, bytes_left):
    """Warm-up copies to engines that start serving within the horizon (see module doc)."""
    H = budgets.horizon_s
    active = sum(1 for e in by_engine.values() if e.lifecycle in (ENGINE_SERVING, ENGINE_WARMING))
    items: list[PlannedMove] = []
    for e in by_engine.values():
        if e.lifecycle != ENGINE_WARMING or e.engine_id not in allowed or e.starts_serving_in_s > H:
            continue
        cap = budgets.max_warming_fraction * e.kv_capacity_bytes - e.spec_bytes
        left = max(0.0, min(e.free_bytes, cap))
        rows = []
        for c in candidates:
            d = dem.get(c.prefix_id)
            holders = gpu_holders.get(c.prefix_id)
            if d is None or not holders or not eligible(c, d) or e.engine_id in holders:
                continue
            src = by_engine[_best_source([h for h in holders if h in by_engine], by_engine, e)]
            copy_s = c.nbytes / max(1.0, min(e.link_bytes_per_s, src.link_bytes_per_s))
            x = _rate(d, H) * H / max(1, active)
            if x < budgets.min_expected_hits:
                continue
            benefit = c.recompute_s * (1.0 - math.exp(-x)) * d.confidence
            cost = copy_s * budgets.copy_cost_weight + c.nbytes * e.displaced_s_per_byte
            net = benefit - cost * budgets.min_benefit_ratio
            if net > 0 and not _link_busy(src, e, copy_s, H):
                rows.append((net, c.prefix_id, c, d, src, copy_s, benefit, x))
        rows.sort(key=lambda r: (-r[0], r[1]))
        for _, pid, c, d, src, copy_s, benefit, x in rows:
            if c.nbytes > left or c.nbytes > bytes_left:
                continue
            left -= c.nbytes
            bytes_left -= c.nbytes
            room[e.engine_id] = max(0.0, room[e.engine_id] - c.nbytes)
            why = (
                f"warm {e.engine_id} before it serves (in {e.starts_serving_in_s:.0f} s): "
                f"~{x:.1f} requests of it expected there in {H:.0f} s, the first would "
                f"recompute {c.recompute_s:.2f} s; copy {copy_s:.2f} s"
            )
            items.append(
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
                )
            )
    return bytes_left, items


def cluster_queue_s(engines: Iterable[EngineState]) -> float:
    """Mean queue (seconds) of the serving engines: what the planner backs off on."""
    qs = [e.queue_s for e in engines if e.lifecycle == ENGINE_SERVING]
    return sum(qs) / len(qs) if qs else 0.0


def backs_off(engines: Iterable[EngineState], budgets: Budgets) -> bool:
    """The serving engines queue more than ``max_cluster_queue_s`` on average: no speculative
    item but warm-ups of joining engines and the copies ``backs_off_around`` lets through."""
    return backs_off_around(engines, budgets, ())


def backs_off_around(
    engines: Iterable[EngineState], budgets: Budgets, holders: Iterable[str]
) -> bool:
    """The back-off for one prefix: the serving engines that do not hold it queue more than
    ``max_cluster_queue_s`` on average. Its holders' queue is left out: where that is its own
    burst, a replica elsewhere is what relieves it."""
    held = set(holders)
    return cluster_queue_s(e for e in engines if e.engine_id not in held) > (
        budgets.max_cluster_queue_s
    )


def queue_gate(engines: Sequence[EngineState], budgets: Budgets) -> dict:
    """What the queues held back in a plan, for its summary: the serving engines' mean queue
    against ``max_cluster_queue_s`` (the back-off) and the engines over ``max_queue_s`` (no item
    lands there), with a sentence saying so. Limits that are off (infinite) read None."""
    q = cluster_queue_s(engines)
    over = sorted(
        e.engine_id
        for e in engines
        if e.lifecycle == ENGINE_SERVING and e.queue_s > budgets.max_queue_s
    )
    backoff = backs_off(engines, budgets)
    if backoff:
        why = (
            f"serving engines queue {q:.2f} s on average (limit {budgets.max_cluster_queue_s:g} "
            "s): speculative copies and promotions held back, but warm-ups of joining engines "
            "and copies of a prefix whose holders carry the queue (the engines that do not "
            "hold it queue under the limit)"
        )
    elif over:
        why = (
            f"{len(over)} serving engine(s) queue over {budgets.max_queue_s:g} s: "
            "no speculative item lands there"
        )
    else:
        why = ""
    return {
        "cluster_queue_s": round(q, 4),
        "max_cluster_queue_s": _finite(budgets.max_cluster_queue_s),
        "max_queue_s": _finite(budgets.max_queue_s),
        "backed_off": backoff,
        "engines_over_max_queue": over,
        "why": why,
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _link_wait(src: EngineState, dst: EngineState, queued: dict[str, float]) -> float:
    """Seconds before a copy from ``src`` to ``dst`` starts: copies queued on either link."""
    return max(
        src.link_queue_s + queued.get(src.engine_id, 0.0),
        dst.link_queue_s + queued.get(dst.engine_id, 0.0),
    )


def _link_busy(
    src: EngineState,
    dst: EngineState,
    copy_s: float,
    horizon: float,
    queued: dict[str, float] | None = None,
) -> bool:
    """The copy would land more than half a horizon from now: its links are busy (with
    copies already queued, and ``queued`` seconds of this plan's own)."""
    q = queued or {}
    return (
        max(
            src.link_queue_s + q.get(src.engine_id, 0.0),
            dst.link_queue_s + q.get(dst.engine_id, 0.0),
        )
        + copy_s
        > 0.5 * horizon
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


def _best_target(c, holders, allowed, room, spare, by_engine) -> str | None:
    """The allowed engine with the most spare capacity (then warming, link, id) that does not
    hold ``c`` and has room for it. ``_Targets`` answers the same question without a scan."""
    best, key = None, None
    for eid in allowed:
        if eid in holders or room[eid] < c.nbytes or spare[eid] <= 0:
            continue
        k = _target_key(eid, spare, by_engine)
        if key is None or k > key:
            best, key = eid, k
    return best


def _target_key(eid: str, spare: dict[str, float], by_engine: dict) -> tuple:
    e = by_engine[eid]
    return (spare[eid], e.lifecycle == ENGINE_WARMING, e.link_bytes_per_s, eid)


class _Targets:
    """``_best_target`` for a whole plan: the allowed engines kept sorted by their key, so a
    query walks down from the best and stops at the first engine that does not hold the prefix
    and has room (a fleet-size plan asks thousands of times over a thousand engines). Spare
    capacity and room only shrink during a plan: an engine with no spare left leaves the order."""

    def __init__(self, allowed, room: dict[str, float], spare: dict[str, float], by_engine):
        self.room, self.spare, self.by_engine = room, spare, by_engine
        self.order = sorted(_target_key(eid, spare, by_engine) for eid in allowed if spare[eid] > 0)

    def best(self, nbytes: float, holders) -> str | None:
        room = self.room
        for key in reversed(self.order):
            eid = key[3]
            if eid not in holders and room[eid] >= nbytes:
                return eid
        return None

    def set_spare(self, eid: str, value: float) -> None:
        old = _target_key(eid, self.spare, self.by_engine)
        i = bisect.bisect_left(self.order, old)
        if i < len(self.order) and self.order[i] == old:
            del self.order[i]
        self.spare[eid] = value
        if value > 0:
            bisect.insort(self.order, _target_key(eid, self.spare, self.by_engine))


def _best_source(holders, by_engine, target, queued: dict[str, float] | None = None) -> str:
    """Same node first (NVLink), then the link that frees up first, the fastest, the least
    loaded."""
    q = queued or {}

    def key(h):
        e = by_engine[h]
        return (
            e.node == target.node,
            -(e.link_queue_s + q.get(h, 0.0)),
            e.link_bytes_per_s,
            -e.load,
            h,
        )

    return max(holders, key=key)
