"""The harm guard's concentration signal: a plan that leaves a prefix measured demand is spreading
on fewer holders than ``reactive`` would.

``predictive`` plans on measured demand plus a forecast (``core.policy.demand``); both compete
for the same room. Where the forecast's copies take the room (a joining engine's warm-up slice,
an engine's speculative slice) that measured demand's copies would have had, a prefix requests
are arriving for now ends the plan on fewer engines than the shipped ``reactive`` (the planner on
the measured part alone) would have put it on. When its burst comes, the router keeps it on
those few holders and queues everything behind it: a copy that concentrates a burst is harm, and
the guard can see it before any request pays for it, from what it already has (the planned
items, the holders per prefix, the measured part of each prefix's demand).

``spread`` plans the same round on measured demand alone (the reactive plan), counts each
prefix's holders after either plan (holders now plus the targets of its items), and where
predictive's plan leaves a prefix on fewer holders it gives back reactive's copies of it
(in reactive's order, up to reactive's count): on each such copy's target it holds back
predictive's items that reactive would not have made there, lowest ranked first, until the bytes
they free hold the copy; an item is held back only where its own prefix keeps at least
reactive's count. A copy is given back only in room so freed (no budget is exceeded that
predictive's plan kept). Each such prefix is reported (``Narrowed``), given back or not, for the
plan summary and the simulator's guard counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from controlplane.core.policy import planner
from controlplane.core.policy.types import (
    Budgets,
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
    PlannedMove,
)
from controlplane.core.policy.value import Calibration
from wire.protocol import TIER_GPU


@dataclass(frozen=True)
class Narrowed:
    """A prefix predictive's plan left on fewer holders than reactive's would have."""

    prefix_id: str
    holders: int  # holders after predictive's plan
    reactive: int  # holders after reactive's
    restored: tuple[str, ...] = ()  # targets given reactive's copy back
    held_back: tuple[str, ...] = ()  # "prefix->target" items held back for them

    def why(self) -> str:
        out = (
            f"prefix {self.prefix_id}: the plan left it on {self.holders} holder(s), "
            f"measured demand alone on {self.reactive}"
        )
        if self.restored:
            out += (
                f"; copies to {', '.join(self.restored)} given back, "
                f"{', '.join(self.held_back) or 'nothing'} held back for them"
            )
        else:
            out += "; no forecast copy to hold back for it"
        return out


def measured_part(demand: Iterable[Demand], horizon_s: float) -> list[Demand]:
    """Each prefix's demand as ``reactive`` plans it: its measured rate (``measured_rate``, a
    burst's onset included) held over the horizon, certain; prefixes with none are left out."""
    return [
        Demand(d.prefix_id, d.measured_rate * horizon_s, measured_rate=d.measured_rate)
        for d in demand
        if d.measured_rate > 0
    ]


def holders_after(
    holdings: Iterable[Holding], items: Iterable[PlannedMove], engines: Iterable[str]
) -> dict[str, set[str]]:
    """Per prefix: the engines holding it in HBM now, plus the targets of ``items``."""
    known = set(engines)
    out: dict[str, set[str]] = {}
    for h in holdings:
        if h.tier == TIER_GPU and h.engine_id in known:
            out.setdefault(h.prefix_id, set()).add(h.engine_id)
    for it in items:
        out.setdefault(it.prefix_id, set()).add(it.target)
    return out


def spread(
    items: Sequence[PlannedMove],
    *,
    candidates: Sequence[Candidate],
    demand: Iterable[Demand],
    holdings: Iterable[Holding],
    engines: Sequence[EngineState],
    budgets: Budgets,
    overrides: Overrides,
    calibration: Calibration | None = None,
) -> tuple[list[PlannedMove], list[Narrowed]]:
    """``items`` (predictive's plan) with the copies that narrow a prefix's spread held back and
    reactive's given back (module doc); and the prefixes it narrowed."""
    measured = measured_part(demand, budgets.horizon_s)
    if not measured or overrides.frozen:
        return list(items), []
    holdings = list(holdings)
    reactive = planner.plan(
        candidates, measured, holdings, engines, budgets, overrides, calibration
    )
    eids = [e.engine_id for e in engines]
    now = holders_after(holdings, (), eids)
    pred = holders_after(holdings, items, eids)
    want = {p: len(h) for p, h in holders_after(holdings, reactive, eids).items()}
    narrowed = [
        p for p in dict.fromkeys(it.prefix_id for it in reactive) if len(pred.get(p, ())) < want[p]
    ]
    if not narrowed:
        return list(items), []
    mine = {(it.prefix_id, it.target) for it in reactive}
    kept = list(items)
    credit: dict[str, float] = {}  # bytes held back on a target and not yet given back
    out: list[Narrowed] = []
    for p in narrowed:
        restored, held = [], []
        before = len(pred.get(p, ()))
        for it in reactive:
            if len(pred.get(p, ())) >= want[p]:
                break
            if it.prefix_id != p or it.target in pred.get(p, ()):
                continue
            t = it.target
            for victim in list(reversed(kept)):
                if credit.get(t, 0.0) >= it.nbytes:
                    break
                q = victim.prefix_id
                if victim.target != t or (q, t) in mine or q == p:
                    continue
                if len(pred[q]) - 1 < want.get(q, len(now.get(q, ()))):
                    continue  # it would narrow its own prefix below reactive's spread
                kept.remove(victim)
                pred[q].discard(t)
                credit[t] = credit.get(t, 0.0) + victim.nbytes
                held.append(f"{q}->{t}")
            if credit.get(t, 0.0) >= it.nbytes:
                credit[t] -= it.nbytes
                kept.append(replace(it, reason=f"spread as measured demand would: {it.reason}"))
                pred.setdefault(p, set()).add(t)
                restored.append(t)
        out.append(Narrowed(p, before, want[p], tuple(restored), tuple(held)))
    return kept, out


def summary(narrowed: Sequence[Narrowed]) -> dict:
    """For a plan's summary (beside the guard's allowances): the prefixes the plan would have
    left on fewer holders than measured demand alone, and what was given back."""
    return {
        "narrowed": len(narrowed),
        "restored": sum(len(n.restored) for n in narrowed),
        "held_back": sum(len(n.held_back) for n in narrowed),
        "why": "; ".join(n.why() for n in narrowed[:5])
        + (f"; and {len(narrowed) - 5} more" if len(narrowed) > 5 else ""),
    }
