"""Replication at ingest: a hot spot (reactive) or a burst's onset (predictive) seen in request
records as they arrive is planned within seconds, not at the next plan cycle.

Each ingest of request records names the workload keys it saw (``demand.signals.
records_ingested``); after it commits, ``react`` measures their demand (``measured``), hands
those keys alone to the shared policy (``core.policy.decide``, the planner under the policy's
budgets and overrides) and stores what it plans as a plan like any other, which the policy's
mode then approves (auto), leaves to an operator (manual) or scores without moving (shadow). A
key is re-planned at most every ``onset.ONSET_REPLAN_S`` per process; copies already planned,
moving or held count as holders (``holders_to_be``), so an ingest never doubles one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.core.policy import onset
from controlplane.core.policy.reactive import HOT_WINDOW_S, ReactiveRule, hot_fanout
from controlplane.queues import Queue, task
from wire.protocol import TIER_GPU

from ..choices import PolicyStrategy
from ..models import Policy, ReplicationPlan
from .cycle import active_policy, plan_and_apply
from .inputs import Inputs, chain_hex, gather, holders_to_be
from .measured import ingest_demand

log = logging.getLogger(__name__)

_last: dict[int, float] = {}  # workload key -> monotonic time of its last ingest re-plan


def react(arrivals: dict[int, list[float]], now=None) -> ReplicationPlan | None:
    """Plan the keys of an ingest whose measured demand calls for it; None when nothing is
    planned (no plan is stored for an ingest that plans nothing)."""
    policy = active_policy()
    if policy is None or policy.strategy == PolicyStrategy.OFF or not arrivals:
        return None
    t0, mono = time.perf_counter(), time.monotonic()
    now = now or timezone.now()
    due = {
        k: v for k, v in arrivals.items() if mono - _last.get(k, -math.inf) >= onset.ONSET_REPLAN_S
    }
    demand, onsets = ingest_demand(due, policy.strategy, now)
    if not demand:
        return None
    inputs = gather(policy, now, measured=demand)
    if policy.strategy == PolicyStrategy.PREDICTIVE:
        # Forecasts plan at the cycle; at ingest, a burst's onset, and the reactive fallback
        # where a holder already queues past the guarded rule (``ReactiveRule``).
        keep = {str(k) for k in onsets} | fallback(inputs)
        inputs = only(inputs, keep)
        demand = {k: v for k, v in demand.items() if str(k) in keep}
        if not demand:
            return None
    for k in demand:
        _last[k] = mono
    pinned = frozenset()
    if policy.hot_fanout and policy.strategy == PolicyStrategy.REACTIVE:
        pinned = fanout(inputs, demand, now)
    plan = plan_and_apply(
        policy, inputs, now, t0, trigger="ingest", store_empty=False, pinned=pinned
    )
    if plan is not None:
        log.info("ingest: plan %s for %d hot key(s)", plan.pk, len(demand))
    return plan


def fallback(inputs: Inputs) -> set[str]:
    """Keys whose busiest holder queues past the guarded reactive rule: its wait over the
    threshold and over twice the copy to the least-queued other engine."""
    rule = ReactiveRule()
    by_id = {e.engine_id: e for e in inputs.engines}
    holders: dict[str, list[str]] = {}
    for h in inputs.holdings:
        if h.tier == TIER_GPU and h.engine_id in by_id:
            holders.setdefault(h.prefix_id, []).append(h.engine_id)
    out = set()
    for c in inputs.candidates:
        held = holders.get(c.prefix_id, [])
        others = [e for e in inputs.engines if e.engine_id not in held]
        if not held or not others:
            continue
        wait = max(by_id[h].queue_s for h in held)
        dst = min(others, key=lambda e: e.queue_s)
        copy_s = c.nbytes / max(1.0, dst.link_bytes_per_s)
        if rule.should_copy(wait - dst.queue_s, copy_s, in_flight=False):
            out.add(c.prefix_id)
    return out


def only(inputs: Inputs, keep: set[str]) -> Inputs:
    """``inputs`` narrowed to the candidates ``keep`` names."""
    return dataclasses.replace(
        inputs,
        candidates=[c for c in inputs.candidates if c.prefix_id in keep],
        demand=[d for d in inputs.demand if d.prefix_id in keep],
        holdings=[h for h in inputs.holdings if h.prefix_id in keep],
    )


def fanout(inputs: Inputs, demand: dict[int, float], now) -> frozenset[str]:
    """Mooncake Store's hot-key fanout: the hot keys (``core.policy.reactive.hot_fanout``) with
    fewer copies in HBM and on their way than it keeps, planned whatever their holders' queue."""
    to_be = holders_to_be(now)
    held: dict[str, int] = {}
    for h in inputs.holdings:
        if h.tier == TIER_GPU:
            held[h.prefix_id] = held.get(h.prefix_id, 0) + 1
    out = set()
    for c in inputs.candidates:
        key = inputs.keys[c.prefix_id].pk
        coming = sum(1 for chain, _ in to_be if chain == chain_hex(c.keys))
        if hot_fanout(
            recent_requests=round(demand.get(key, 0.0) * HOT_WINDOW_S),
            holders=held.get(c.prefix_id, 0),
            copies_in_flight=coming,
        ):
            out.add(c.prefix_id)
    return frozenset(out)


@task(Queue.DISPATCH, name="controlplane.replication.tasks.react_to_ingest")
def react_to_ingest(arrivals: dict[str, list[float]]) -> int | None:
    """Plan the hot keys of an ingest now (``plans.react``); the plan's id, or None."""
    plan = react({int(k): v for k, v in arrivals.items()})
    return plan.pk if plan else None


def on_records_ingested(sender, arrivals: dict[int, list[float]], **kwargs) -> None:
    """``demand.signals.records_ingested``: react once the ingest has committed."""
    if (
        not settings.PREWARM_REACT_AT_INGEST
        or not arrivals
        or not Policy.objects.filter(active=True).exclude(strategy=PolicyStrategy.OFF).exists()
    ):
        return  # nothing would be planned: no task to send
    payload = {str(k): v for k, v in arrivals.items()}
    transaction.on_commit(lambda: react_to_ingest.delay(payload))
