"""The harm guard: speculation that measures its own effect and backs off (AIMD).

Each round the caller tells the guard what its last speculative copies did (``Signals``), from
what the live system sees and the simulator reproduces the same way:

- the queue of each copy's target after it landed against its queue when the copy was planned
  (a copy that leaves its target queueing beyond ``queue_limit_s``, and higher than before by
  more than the engines that took no copy rose meanwhile, took compute a served request needed);
- misses on a target for the ``evicted`` reason (``core.misses``) while it took speculative
  copies: the blocks the copies displaced were wanted;
- the TTFT of treated against held-out requests of a prefix group, where both arms measured
  enough for an interval: harm only when treated is slower beyond noise (``Compared``);
- a copy's time against its lead: from planning to the first request it was for, a request of
  its prefix its target served while it was in flight (the ``warming`` miss reason): a copy
  landing after that request came too late for it.

A queue raised or blocks evicted are an engine's harm; a late copy or a worse treated TTFT a
prefix group's. On harm the guard cuts the allowance of the engine or group multiplicatively
(``DECREASE``, down to ``FLOOR``), at most once a round; on a round with no harm it grows it back
additively (``INCREASE``) up to 1 (full speculation: the guard then changes nothing). The
allowance scales what the planner's items may take: an engine takes speculative bytes up to its
allowance x its speculative slice (``max_spec_vram_fraction`` of its capacity); a prefix group
gets its allowance's share of the bytes planned for it this round. Warm-ups of joining engines
are let through (their queue before is none; the scale-out needs them). ``summary`` says how
much speculation is allowed now and why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.core.policy.types import Budgets, Candidate, EngineState, PlannedMove
from wire.protocol import ENGINE_WARMING

DECREASE = 0.5  # harm: the allowance is multiplied by this
INCREASE = 0.125  # a round with no harm: the allowance grows by this
FLOOR = 1.0 / 16  # the allowance never falls below this (the guard keeps probing)
QUEUE_LIMIT_S = 1.0  # a target's queue beyond this after a copy (with no limit in the budgets)
QUEUE_RISE_S = 0.25  # ... and higher than before by more than this: the copy took compute
EVICTED_MISSES = 2  # ``evicted`` misses on a target that took copies this round: harm
TTFT_MARGIN = 0.10  # treated TTFT above held-out's by this share, beyond noise: harm


@dataclass(frozen=True, kw_only=True)
class Landed:
    """A speculative copy that landed since the last round, and what followed."""

    target: str
    group: str  # its prefix group (the candidate's workload key)
    queue_before_s: float | None  # the target's queue when it was planned (None: joining)
    queue_after_s: float  # the target's queue now
    # the mean queue rise, over the same time, of the serving engines that took no copy: the
    # control a target's own rise is compared with (a load that rises everywhere is no harm)
    peers_rise_s: float = 0.0
    copy_s: float = 0.0  # seconds from planning to its landing
    # seconds from planning to the first request it was for (a ``warming`` miss on its target);
    # infinite where none came before it landed
    lead_s: float = math.inf


@dataclass(frozen=True, kw_only=True)
class Compared:
    """A prefix group's treated against held-out TTFT: each arm's per-request mean and the low
    end of the 95% interval of the difference (treated minus held out)."""

    treated_s: float
    held_out_s: float
    diff_low_s: float


@dataclass(frozen=True, kw_only=True)
class Signals:
    landed: Sequence[Landed] = ()
    evicted_misses: Mapping[str, int] = field(default_factory=dict)  # per target engine
    # per prefix group, where both arms measured enough for an interval
    ttft: Mapping[str, Compared] = field(default_factory=dict)


@dataclass(frozen=True)
class GuardState:
    """Allowances below 1 per engine and per prefix group, and why each was set."""

    engines: Mapping[str, float] = field(default_factory=dict)
    groups: Mapping[str, float] = field(default_factory=dict)
    why: Mapping[str, str] = field(default_factory=dict)  # "engine:<id>" / "group:<key>"

    def engine(self, eid: str) -> float:
        return self.engines.get(eid, 1.0)

    def group(self, key: str) -> float:
        return self.groups.get(key, 1.0)

    def to_json(self) -> dict:
        return {"engines": dict(self.engines), "groups": dict(self.groups), "why": dict(self.why)}

    @classmethod
    def from_json(cls, data: Mapping | None) -> GuardState:
        if not isinstance(data, Mapping):
            return cls()

        def floats(m) -> dict[str, float]:
            if not isinstance(m, Mapping):
                return {}
            return {
                str(k): min(1.0, max(FLOOR, float(v)))
                for k, v in m.items()
                if isinstance(v, int | float)
            }

        why = data.get("why")
        return cls(
            floats(data.get("engines")),
            floats(data.get("groups")),
            {str(k): str(v) for k, v in why.items()} if isinstance(why, Mapping) else {},
        )


def queue_limit_s(budgets: Budgets) -> float:
    """The queue a copy must not push its target beyond: the planner's target limit
    (``max_queue_s``: no item lands on an engine queueing longer), else the back-off's."""
    for limit in (budgets.max_queue_s, budgets.max_cluster_queue_s):
        if math.isfinite(limit):
            return limit
    return QUEUE_LIMIT_S


def harms(signals: Signals, *, limit_s: float) -> tuple[dict[str, str], dict[str, str]]:
    """(engines, groups) the signals show harm on, each with its reason."""
    engines: dict[str, str] = {}
    groups: dict[str, str] = {}
    for c in signals.landed:
        before = c.queue_before_s
        if (
            before is not None
            and c.queue_after_s > limit_s
            and c.queue_after_s > before + max(0.0, c.peers_rise_s) + QUEUE_RISE_S
        ):
            why = (
                f"a copy raised its queue from {before:.2f} s to {c.queue_after_s:.2f} s "
                f"(limit {limit_s:g} s)"
            )
            engines.setdefault(c.target, why)  # the engine's harm: its group is not cut
        if c.copy_s > c.lead_s:
            groups.setdefault(
                c.group,
                f"a copy took {c.copy_s:.1f} s to land; a request it was for came "
                f"{c.lead_s:.1f} s after planning",
            )
    for eid, n in signals.evicted_misses.items():
        if n >= EVICTED_MISSES:
            engines.setdefault(eid, f"{n} misses on blocks evicted while it took copies")
    for key, cmp in signals.ttft.items():
        # Slower beyond noise (the interval's low end above zero) and by more than the margin:
        # a few slow requests on one side are not evidence that the copies hurt.
        slower = cmp.treated_s > cmp.held_out_s * (1 + TTFT_MARGIN)
        if cmp.diff_low_s > 0 and cmp.held_out_s > 0 and slower:
            groups.setdefault(
                key,
                f"treated TTFT {cmp.treated_s:.3f} s above held-out {cmp.held_out_s:.3f} s "
                f"(difference's 95% interval from +{cmp.diff_low_s:.3f} s)",
            )
    return engines, groups


def observe(state: GuardState, signals: Signals, *, limit_s: float) -> GuardState:
    """The next state: harm halves an allowance (once a round, not below ``FLOOR``); a round
    with no harm on an engine or group below 1 grows it by ``INCREASE``."""
    bad_e, bad_g = harms(signals, limit_s=limit_s)
    why = dict(state.why)

    def step(current: Mapping[str, float], bad: dict[str, str], kind: str) -> dict[str, float]:
        out = {}
        for key in set(current) | set(bad):
            a = current.get(key, 1.0)
            if key in bad:
                a = max(FLOOR, a * DECREASE)
                why[f"{kind}:{key}"] = f"cut to {a:.3g}: {bad[key]}"
            else:
                a = min(1.0, a + INCREASE)
                why[f"{kind}:{key}"] = f"grown to {a:.3g}: no harm seen since the last round"
            if a < 1.0:
                out[key] = a
            else:
                why.pop(f"{kind}:{key}", None)
        return out

    engines = step(state.engines, bad_e, "engine")
    groups = step(state.groups, bad_g, "group")
    return GuardState(engines, groups, why)


def admit(
    items: Iterable[PlannedMove],
    *,
    state: GuardState,
    engines: Sequence[EngineState],
    candidates: Sequence[Candidate],
    budgets: Budgets,
) -> list[PlannedMove]:
    """The items the allowances let through, in the planner's order (see the module doc)."""
    items = list(items)
    if not state.engines and not state.groups:
        return items
    by_engine = {e.engine_id: e for e in engines}
    group_of = {c.prefix_id: c.workload_key for c in candidates}
    planned: dict[str, float] = {}
    for it in items:
        g = group_of.get(it.prefix_id, it.prefix_id)
        planned[g] = planned.get(g, 0.0) + it.nbytes
    taken_e: dict[str, float] = {}
    taken_g: dict[str, float] = {}
    out = []
    for it in items:
        e = by_engine.get(it.target)
        g = group_of.get(it.prefix_id, it.prefix_id)
        if e is None or e.lifecycle == ENGINE_WARMING:
            out.append(it)
            continue
        cap_e = budgets.spec_cap_bytes(e.kv_capacity_bytes, state.engine(it.target))
        used_e = e.spec_bytes + taken_e.get(it.target, 0.0) + it.nbytes
        used_g = taken_g.get(g, 0.0) + it.nbytes
        if state.engine(it.target) < 1.0 and used_e > cap_e:
            continue
        if state.group(g) < 1.0 and used_g > state.group(g) * planned[g]:
            continue
        taken_e[it.target] = taken_e.get(it.target, 0.0) + it.nbytes
        taken_g[g] = used_g
        out.append(it)
    return out


def summary(state: GuardState, *, planned: int = 0, admitted: int = 0) -> dict:
    """How much speculation is allowed now and why, for a plan's summary (and the gauge):
    ``allowed`` is the lowest allowance (1: the guard holds nothing back)."""
    allowances = [*state.engines.values(), *state.groups.values()]
    allowed = min(allowances) if allowances else 1.0
    if not allowances:
        why = "no harm seen: speculation at full budget"
    else:
        worst = sorted(state.why.items())
        why = "; ".join(f"{k} {v}" for k, v in worst[:5])
        if len(worst) > 5:
            why += f"; and {len(worst) - 5} more"
    return {
        "allowed": round(allowed, 4),
        "engines": {k: round(v, 4) for k, v in sorted(state.engines.items())},
        "groups": {k: round(v, 4) for k, v in sorted(state.groups.items())},
        "held_back": max(0, planned - admitted),
        "why": why,
        "state": state.to_json(),
    }


def spare_only(
    items: Iterable[PlannedMove], *, engines: Sequence[EngineState], takes_compute: bool
) -> tuple[list[PlannedMove], dict[str, str]]:
    """Speculation only into spare capacity: where an item takes its target's compute (a
    warm-up is a prefill on the target engine: ``takes_compute``), it yields to the requests
    queued there: an item whose serving target reports any queue is held this round. Returns
    (the items kept, per target held the reason). A copy's bytes yield to serving traffic on its
    link where the link's bandwidth is taken net of serving (``EngineState.link_bytes_per_s``)."""
    items = list(items)
    if not takes_compute:
        return items, {}
    queued = {
        e.engine_id: e.queue_s for e in engines if e.lifecycle != ENGINE_WARMING and e.queue_s > 0
    }
    kept, held = [], {}
    for it in items:
        q = queued.get(it.target)
        if q is None:
            kept.append(it)
        else:
            held[it.target] = (
                f"warm-up held: requests queued on its target ({q:.2f} s); it yields to them"
            )
    return kept, held
