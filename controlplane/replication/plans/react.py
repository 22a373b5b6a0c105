"""Replication at ingest: a hot spot or a burst's onset seen in request records as they arrive
is planned within seconds, not at the next plan cycle, under either strategy.

Each ingest of request records names the workload keys it saw (``demand.signals.
records_ingested``); after it commits, ``react`` measures their demand (``measured``: the last
minute's rate; under ``predictive`` a burst's onset where the batch shows one), keeps the keys
the shared ingest rule re-plans (``core.policy.ingest.wants_replan``: a rate now above what
their holders can take; under ``predictive`` also the keys whose holder queues past the guarded
reactive rule) and the storm bound lets through (``BOUND``: one per process; a minimum interval
with hysteresis per key, no second copy of a key while one is on its way, and bytes in flight
per target), hands them to the shared policy (``core.policy.strategy``, their demand by the shared
rule, ``core.policy.demand``) and stores what it plans as a plan like any other, which the
policy's mode then approves (auto), leaves to an operator (manual) or scores without moving
(shadow); the plan's summary carries the bound's counts (``ingest``). Copies already planned,
moving or held count as holders (``holders_to_be``), so an ingest never doubles one.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.core.policy import ingest
from controlplane.core.policy.demand import MEASURE_WINDOW_S
from controlplane.core.policy.reactive import (
    HOT_WINDOW_S,
    ReactiveRule,
    hot_fanout,
    queue_fallback,
)
from controlplane.queues import Queue, task
from wire.protocol import ENGINE_SERVING, TIER_GPU

from ..choices import JobAction, JobState, PolicyStrategy
from ..models import Policy, ReplicationJob, ReplicationPlan
from .cycle import active_policy, plan_and_apply
from .inputs import Inputs, chain_hex, gather, holders_to_be
from .measured import ingest_demand

log = logging.getLogger(__name__)

BOUND = ingest.IngestBound()  # this process's storm bound (``core.policy.ingest``)


def react(arrivals: dict[int, list[float]], now=None) -> ReplicationPlan | None:
    """Plan the keys of an ingest whose measured demand calls for it; None when nothing is
    planned (no plan is stored for an ingest that plans nothing)."""
    policy = active_policy()
    if policy is None or policy.strategy == PolicyStrategy.OFF or not arrivals:
        return None
    t0, mono = time.perf_counter(), time.monotonic()
    now = now or timezone.now()
    rates, _onsets = ingest_demand(arrivals, policy.strategy, now)
    if not rates:
        return None
    inputs = gather(policy, now, measured=rates, only=list(rates))
    # Under predictive, also the keys whose holder queues past the guarded reactive rule; with
    # the hot fanout (reactive), the hot keys under its replica count, whatever their holders.
    extra: set[str] = set()
    pinned = frozenset()
    if policy.strategy == PolicyStrategy.PREDICTIVE:
        extra = fallback(inputs)
    elif policy.hot_fanout:
        pinned = fanout(inputs, rates, now)
        extra = set(pinned)
    keep = replanned(inputs, rates, mono, extra)
    if not keep:
        return None
    inputs = only(inputs, keep)
    pinned = pinned & keep
    plan = plan_and_apply(
        policy,
        inputs,
        now,
        t0,
        trigger="ingest",
        store_empty=False,
        pinned=pinned,
        bound=BOUND,
        rates={str(k): v for k, v in rates.items()},
    )
    if plan is not None:
        log.info("ingest: plan %s for %d hot key(s)", plan.pk, len(keep))
    return plan


def replanned(
    inputs: Inputs, rates: dict[int, float], now: float, extra: set[str] = frozenset()
) -> set[str]:
    """The candidates the shared ingest rule re-plans (``core.policy.ingest.wants_replan``;
    and ``extra``) that the storm bound lets through now (``now``: monotonic seconds)."""
    by_id = {e.engine_id: e for e in inputs.engines}
    serving = [e.load for e in inputs.engines if e.lifecycle == ENGINE_SERVING]
    mean = sum(serving) / len(serving) if serving else 0.0
    holders: dict[str, list[float]] = {}
    for h in inputs.holdings:
        if h.tier == TIER_GPU and h.engine_id in by_id:
            holders.setdefault(h.prefix_id, []).append(by_id[h.engine_id].load)
    moving = in_flight_chains()
    out = set()
    for c in inputs.candidates:
        rate = rates.get(inputs.keys[c.prefix_id].pk, 0.0)
        if c.prefix_id not in extra and not ingest.wants_replan(
            arrivals=rate * MEASURE_WINDOW_S,
            rate=rate,
            blocks=len(c.keys),
            min_blocks=ReactiveRule().min_blocks,
            holders=len(holders.get(c.prefix_id, ())),
            # the holders' load (the planner's spare capacity); held nowhere: the fleet's
            load=sum(holders[c.prefix_id]) / len(holders[c.prefix_id])
            if c.prefix_id in holders
            else mean,
            service_s=c.service_s,
        ):
            continue
        if BOUND.due(c.prefix_id, now=now, rate=rate, in_flight=chain_hex(c.keys) in moving):
            out.add(c.prefix_id)
    return out


def in_flight_chains() -> set[tuple[str, ...]]:
    """Chains with a copy approved and not landed yet (on its way: not a holder yet)."""
    jobs = ReplicationJob.objects.filter(state__in=JobState.IN_FLIGHT, action=JobAction.REPLICATE)
    return {chain_hex(chain) for chain in jobs.values_list("prefix_keys", flat=True)}


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
        dst = min(others, key=lambda e: e.queue_s)
        if queue_fallback(
            rule,
            holder_waits_s=[by_id[h].queue_s for h in held],
            other_waits_s=[dst.queue_s],
            copy_s=c.nbytes / max(1.0, dst.link_bytes_per_s),
        ):
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
