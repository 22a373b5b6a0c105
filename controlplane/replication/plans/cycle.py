"""A planning cycle: the database and residency index in, ``ReplicationPlan`` rows out.

Describes the cluster to the pure planner (``controlplane.core.policy.planner.plan``, the function the
simulator's predictive policy runs too) and stores its items. Then the policy's mode decides:
``shadow`` keeps the plan as never executed and records the replicas it would have placed (so
they are scored as if executed), ``auto`` approves it through ``decisions.decide_plan`` within budgets,
``manual`` leaves it for an operator. Overrides are applied here and again at approval.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.core.policy import harm_guard, spread
from controlplane.core.policy.backoff import queue_gate
from controlplane.core.policy.ingest import IngestBound
from controlplane.core.policy.strategy import Decision, plan_moves
from controlplane.core.policy.types import Budgets, PlannedMove
from controlplane.demand.models import WorkloadKey
from controlplane.demand.services import want_prefix_tokens
from controlplane.fleet.choices import EngineLifecycle
from controlplane.fleet.configured_index import get_index
from controlplane.fleet.models import Engine
from controlplane.forecasting.models import Forecast
from controlplane.realtime import events
from controlplane.realtime.publish import publish_event
from wire import blockhash
from wire.protocol import TIER_GPU

from ..choices import OverrideKind, PlanState, PolicyMode, PolicyStrategy, Transport
from ..models import PlanItem, Policy, ReplicationPlan, SpeculativeReplica
from ..services import active_overrides
from . import guard_feed
from .decisions import decide_plan
from .inputs import Inputs, chain_hex, gather, holders_to_be
from .measured import measured_rates
from .value import calibration as value_calibration

log = logging.getLogger(__name__)


def _pin_items(inputs: Inputs) -> list[PlannedMove]:
    """Pins: copy the pinned chain to the pinned engine from a holder, whatever the forecast."""
    if inputs.overrides.frozen:
        return []
    index, out = get_index(), []
    for o in active_overrides().filter(kind=OverrideKind.PIN).select_related("engine"):
        chain = tuple(blockhash.from_hex(h) for h in o.prefix_keys)
        holders = {h.engine: h for h in index.holders(chain, limit=64) if h.depth == len(chain)}
        if (
            o.engine_id in holders
            or not holders
            or str(o.engine_id) in inputs.overrides.excluded_engines
        ):
            continue
        src = next(iter(holders))
        nbytes = len(chain) * (o.engine.bytes_per_block or 0)
        out.append(
            PlannedMove(
                f"pin:{o.pk}",
                chain,
                str(src),
                str(o.engine_id),
                TIER_GPU,
                nbytes,
                0.0,
                0.0,
                0.0,
                1.0,
                f"pinned by override #{o.pk}: {o.reason or 'no reason given'}",
            )
        )
    return out


def update_readiness(inputs: Inputs, planned: list[PlannedMove]) -> dict[int, float]:
    """Readiness of each warming engine: the share of the bytes of the forecast-hot prefixes it
    is planned to hold that are already resident there. 1.0 when none are planned for it."""
    wanted: dict[str, set[str]] = {}
    for it in planned:
        wanted.setdefault(it.target, set()).add(it.prefix_id)
    held = {(h.prefix_id, h.engine_id) for h in inputs.holdings if h.tier == TIER_GPU}
    for it in SpeculativeReplica.objects.filter(evicted_at__isnull=True, shadow=False).values_list(
        "workload_key_id", "engine_id"
    ):
        wanted.setdefault(str(it[1]), set()).add(str(it[0]))
    sizes = {c.prefix_id: c.nbytes for c in inputs.candidates}
    out = {}
    for e in inputs.engines:
        if e.lifecycle != EngineLifecycle.WARMING:
            continue
        need = wanted.get(e.engine_id, set())
        total = sum(sizes.get(p, 0) for p in need)
        have = sum(sizes.get(p, 0) for p in need if (p, e.engine_id) in held)
        out[int(e.engine_id)] = round(have / total, 4) if total else 1.0
    for pk, r in out.items():
        Engine.objects.filter(pk=pk).update(readiness=r)
    if out:
        publish_event(events.engine_readiness({str(k): v for k, v in out.items()}))
    return out


def active_policy(policy_id: int | None = None) -> Policy | None:
    if policy_id:
        return Policy.objects.filter(pk=policy_id).first()
    return Policy.objects.filter(active=True).first()


def run_cycle(policy_id: int | None = None, now=None) -> ReplicationPlan | None:
    """Plan, store, then apply the policy's mode. Returns the stored plan (None: no policy, or
    its strategy is off)."""
    policy = active_policy(policy_id)
    if policy is None:
        log.info("plan: no active policy")
        return None
    if policy.strategy == PolicyStrategy.OFF:
        log.info("plan: policy %s replicates nothing (strategy off)", policy.name)
        return None
    now = now or timezone.now()
    t0 = time.perf_counter()
    # What the last minute measured, under either strategy: predictive's forecasts add to it
    # (core.policy.demand), never replace it.
    measured = measured_rates(None, now)
    return plan_and_apply(policy, gather(policy, now, measured), now, t0)


def plan_and_apply(
    policy: Policy,
    inputs: Inputs,
    now,
    t0: float,
    trigger: str = "cycle",
    store_empty: bool = True,
    pinned: frozenset[str] = frozenset(),  # the hot fanout's keys (``react.fanout``)
    bound: IngestBound | None = None,  # an ingest re-plan's storm bound (``react``)
    rates: dict[str, float] | None = None,  # ... and its keys' rates now
) -> ReplicationPlan | None:
    """The shared policy's items for ``inputs`` (``core.policy.strategy``: the planner under the
    policy's budgets and overrides, cut by the harm guard), stored as a plan; then the policy's
    mode decides."""
    budgets = Budgets.of(policy)
    gate = queue_gate(inputs.engines, budgets)
    # The harm guard's state: stepped by the plan cycle, kept by plans made at ingest.
    state, observed = guard_feed.state_for(policy, inputs, budgets, now, step=trigger == "cycle")
    # The guard's concentration signal: predictive's plan leaves no prefix on fewer holders
    # than its measured demand alone would (core.policy.spread); the summary says where.
    narrowed: list[spread.Narrowed] = []
    decision = _decide(policy, inputs, budgets, state, pinned, narrowed, now)
    # Speculation only into spare capacity: a warm-up (a prefill on its target) yields to the
    # requests queued there; the summary says which targets it held back.
    items, yielded = harm_guard.spare_only(
        decision.items,
        engines=inputs.engines,
        takes_compute=policy.default_transport == Transport.WARMUP,
    )
    guard_summary = guard_feed.summary(state, observed, inputs, decision.planned, items)
    guard_summary["yielded"] = yielded
    guard_summary["spread"] = spread.summary(narrowed)
    items = _not_held_yet(inputs, items, now, with_pins=trigger == "cycle")
    if bound is not None:  # the ingest re-plan's bound per target (core.policy.ingest)
        items = bound.admit(items, engines=inputs.engines, now=time.monotonic(), rates=rates or {})
    items, waiting = _with_token_ids(policy, inputs, items)
    if not items and not store_empty:
        return None
    plan = store(
        policy,
        inputs,
        items,
        time.perf_counter() - t0,
        waiting,
        gate,
        trigger,
        guard_summary,
        ingest=bound.stats() if bound is not None else None,
    )
    update_readiness(inputs, items)
    if policy.mode == PolicyMode.SHADOW:
        _shadow_replicas(plan, policy, now)
    elif policy.mode == PolicyMode.AUTO and items:
        decide_plan(plan.pk, None, True, reason=f"auto mode: approved within budgets ({trigger})")
    return plan


def _decide(
    policy: Policy,
    inputs: Inputs,
    budgets: Budgets,
    guard: harm_guard.GuardState,
    pinned: frozenset[str],
    narrowed: list[spread.Narrowed],
    now,
) -> Decision:
    """``core.policy.strategy`` on the inputs, the hot fanout's keys pinned (planned as pins are,
    and saying why), the value model corrected by what its copies measured (``plans.value``);
    the prefixes predictive's plan would have narrowed go to ``narrowed``."""
    overrides = inputs.overrides
    if pinned:
        overrides = dataclasses.replace(overrides, pinned=overrides.pinned | pinned)
    decision = plan_moves(
        strategy=policy.strategy,
        candidates=inputs.candidates,
        demand=inputs.demand,
        holdings=inputs.holdings,
        engines=inputs.engines,
        budgets=budgets,
        overrides=overrides,
        guard=guard,
        narrowed=narrowed,
        calibration=value_calibration(now),
    )
    if not pinned:
        return decision
    fanout = [
        dataclasses.replace(it, reason="hot fanout: " + it.reason.removeprefix("pinned; "))
        if it.prefix_id in pinned
        else it
        for it in decision.items
    ]
    return dataclasses.replace(decision, items=fanout)


def _not_held_yet(
    inputs: Inputs, items: list[PlannedMove], now, *, with_pins: bool
) -> list[PlannedMove]:
    """One replica per (prefix, engine): copies planned, moving, landed or held (and held-out
    pairs) are holders-to-be; the residency index alone does not show them yet. ``with_pins``:
    the pins' items first (the plan cycle's)."""
    to_be = holders_to_be(now)
    pins = _pin_items(inputs) if with_pins else []
    return [it for it in pins + items if (chain_hex(it.keys), int(it.target)) not in to_be]


def _with_token_ids(
    policy: Policy, inputs: Inputs, items: list[PlannedMove]
) -> tuple[list[PlannedMove], int]:
    """Executors that address KV by token ids (warm-ups, LMCache) can act only on prefixes whose
    token ids a gateway has sent. Items of the others are not planned (a job sent now would only
    fail): their keys are wanted, so the next record that carries the token ids keeps them, and
    a later plan places them. Returns (the items to plan, how many wait for token ids)."""
    if policy.default_transport not in Transport.NEEDS_TOKENS:
        return items, 0
    pks = {key.pk for it in items if (key := inputs.keys.get(it.prefix_id)) is not None}
    known = set(
        WorkloadKey.objects.filter(pk__in=pks)
        .exclude(prefix_token_ids=[])
        .values_list("pk", flat=True)
    )
    ready = [it for it in items if getattr(inputs.keys.get(it.prefix_id), "pk", None) in known]
    if pks - known:
        want_prefix_tokens(pks - known)
    return ready, len(items) - len(ready)


@transaction.atomic
def store(
    policy: Policy,
    inputs: Inputs,
    items: list[PlannedMove],
    planned_s: float,
    waiting_for_token_ids: int = 0,
    queues: dict | None = None,
    trigger: str = "cycle",
    guard: dict | None = None,
    ingest: dict | None = None,
) -> ReplicationPlan:
    # A new proposal supersedes the open ones: approving a stale plan would act on old residency.
    ReplicationPlan.objects.filter(state=PlanState.PROPOSED).update(state=PlanState.SUPERSEDED)
    plan = ReplicationPlan.objects.create(
        policy=policy,
        mode=policy.mode,
        state=PlanState.SHADOW if policy.mode == PolicyMode.SHADOW else PlanState.PROPOSED,
        summary={
            "candidates": len(inputs.candidates),
            "engines": len(inputs.engines),
            "items": len(items),
            "bytes": sum(i.nbytes for i in items),
            "expected_ttft_saved_s": round(sum(i.expected_ttft_saved_s for i in items), 3),
            "planner_seconds": round(planned_s, 4),
            # items left out until a gateway sends their prefixes' token ids (warm-up, LMCache)
            "waiting_for_token_ids": waiting_for_token_ids,
            "frozen": inputs.overrides.frozen,
            # what decided it: the policy's strategy, and the plan cycle or an ingest (a hot
            # spot or a burst's onset seen in request records as they arrived)
            "strategy": policy.strategy,
            "trigger": trigger,
            # the engines' queues against the policy's limits: what they held back, and why
            "queues": queues or {},
            # the harm guard: how much speculation it allows now and why (core.policy.harm_guard)
            **({"guard": guard} if guard is not None else {}),
            # an ingest re-plan: its storm bound's counts in this process (core.policy.ingest)
            **({"ingest": ingest} if ingest is not None else {}),
            # each planned key's demand, by its two parts (core.policy.demand): the rate
            # measured now and the forecast's (requests/s; 0: none)
            "demand": demand_parts(inputs, items),
            # the forecaster behind each planned key (scoring credits it), not all 100k
            "forecasters": {
                it.prefix_id: inputs.forecasters[it.prefix_id]
                for it in items
                if it.prefix_id in inputs.forecasters
            },
        },
    )
    rows = []
    for it in items:
        key = inputs.keys.get(it.prefix_id)
        rows.append(
            PlanItem(
                plan=plan,
                workload_key_id=key.pk if key else None,
                prefix_keys=list(map(blockhash.to_hex, it.keys)),
                prefix_tokens=key.prefix_tokens if key else 0,
                source_id=int(it.source),
                target_id=int(it.target),
                tier=it.tier,
                bytes=it.nbytes,
                expected_ttft_saved_s=it.expected_ttft_saved_s,
                cost_s=it.cost_s,
                confidence=it.confidence,
                reason=it.reason[:2000],
                value_terms=it.terms.as_dict() if it.terms else {},
            )
        )
    PlanItem.objects.bulk_create(rows, batch_size=2000)
    if policy.default_transport in Transport.NEEDS_TOKENS:
        # Its executor addresses KV by token ids: keep them for the keys this plan uses.
        want_prefix_tokens({r.workload_key_id for r in rows if r.workload_key_id})
    publish_event(events.plan_created(plan.pk, plan.mode, plan.state, len(rows)))
    return plan


def demand_parts(inputs: Inputs, items: list[PlannedMove]) -> dict[str, dict]:
    """Per planned key: its measured and forecast rate (``Demand.measured_rate`` /
    ``forecast_rate``), and the rate the plan provisioned for."""
    by_id = {d.prefix_id: d for d in inputs.demand}
    horizon = max(1e-9, float(inputs.horizon_s))
    out = {}
    for it in items:
        d = by_id.get(it.prefix_id)
        if d is not None and it.prefix_id not in out:
            out[it.prefix_id] = {
                "measured_per_s": round(d.measured_rate, 4),
                "forecast_per_s": round(d.forecast_rate, 4),
                "planned_per_s": round(d.expected_requests / horizon, 4),
            }
    return out


def _shadow_replicas(plan: ReplicationPlan, policy: Policy, now) -> None:
    """Shadow mode: the replicas the plan would have placed, to be scored as if executed."""
    ttl = timedelta(seconds=policy.replica_ttl_s)
    forecasters = plan.summary.get("forecasters", {})
    SpeculativeReplica.objects.bulk_create(
        [
            SpeculativeReplica(
                item=i,
                engine_id=i.target_id,
                workload_key_id=i.workload_key_id,
                prefix_keys=i.prefix_keys,
                tier=i.tier,
                bytes=i.bytes,
                shadow=True,
                bytes_moved=i.bytes,  # what it would have moved: it never did
                forecaster=forecasters.get(str(i.workload_key_id), ""),
                placed_at=now,
                expires_at=now + ttl,
            )
            for i in plan.items.all()
        ],
        batch_size=2000,
    )


def due(policy: Policy, now=None) -> dict[str, bool]:
    """Whether the policy's forecast and plan cadences say a new cycle is due."""
    now = now or timezone.now()
    last_f = (
        Forecast.objects.order_by("-generated_at").values_list("generated_at", flat=True).first()
    )
    last_p = (
        ReplicationPlan.objects.order_by("-created_at").values_list("created_at", flat=True).first()
    )
    return {
        "forecast": last_f is None or (now - last_f).total_seconds() >= policy.forecast_every_s,
        "plan": last_p is None or (now - last_p).total_seconds() >= policy.plan_every_s,
        "open_plan": ReplicationPlan.objects.filter(state__in=PlanState.OPEN).exists(),
    }
