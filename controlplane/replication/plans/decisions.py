"""Plan decisions: approve or reject plan items, within the policy's budgets whatever a client
sends; each approved item becomes a job handed to delivery."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from controlplane.audit.services import record
from controlplane.core.errors import Invalid
from controlplane.core.policy.types import Budgets
from controlplane.fleet.choices import EngineLifecycle, NodeState
from controlplane.realtime import events
from controlplane.realtime.publish import publish_event
from wire import protocol

from ..choices import (
    ItemDecision,
    JobAction,
    JobState,
    OverrideKind,
    PlanState,
    PolicyMode,
    Transport,
)
from ..jobs.delivery import dispatch_job
from ..jobs.states import transition
from ..models import (
    HoldoutDraw,
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from ..services import active_overrides, frozen
from . import holdout
from .inputs import chain_hex, holders_to_be, spec_bytes_by_engine


def _arms(now) -> dict[int, tuple[bool, int | None]]:
    """Which arm each prefix is in now, and under which draw: key -> (held out, draw id). The
    holdout is measured on a prefix's requests (cache-aware routing never serves a held-out
    pair), so the arm is drawn per prefix (``holdout.assign``: permuted blocks) and kept while
    the prefix has a live speculative record: a held-out replica not yet expired keeps it held
    out, a copy in flight or a live replica keeps it treated. A prefix is then never on both
    arms at once, and its requests measure one of them; once its records' holds end, its next
    approved item draws again (a new assignment, the holdout's unit), and not before its draw's
    measuring window has ended."""
    arms: dict[int, tuple[bool, int | None]] = {}
    live = SpeculativeReplica.objects.filter(
        shadow=False,
        workload_key_id__isnull=False,
        expires_at__gt=now,
        evicted_at__isnull=True,
        lost_at__isnull=True,
    )
    for key, held, draw in live.values_list("workload_key_id", "held_out", "item__holdout_draw_id"):
        if key not in arms or (held and not arms[key][0]):
            arms[key] = (held, draw)
    # An assignment's window runs its course whatever became of its copy (intention to
    # treat): its prefix keeps the arm until the window ends.
    for key, held, draw in HoldoutDraw.objects.filter(
        window_end__gt=now, workload_key_id__isnull=False
    ).values_list("workload_key_id", "held_out", "pk"):
        arms.setdefault(key, (held, draw))
    for key, draw in ReplicationJob.objects.filter(
        state__in=(*protocol.JOB_LIVE, JobState.LANDED), item__workload_key_id__isnull=False
    ).values_list("item__workload_key_id", "item__holdout_draw_id"):
        arms.setdefault(key, (False, draw))
    return arms


def bytes_this_interval(interval_s: int) -> int:
    """Bytes of the copies created in the last ``interval_s`` (the policy's transfer budget)."""
    since = timezone.now() - timedelta(seconds=interval_s)
    return (
        ReplicationJob.objects.filter(created_at__gte=since, action=JobAction.REPLICATE)
        .exclude(state=JobState.CANCELLED)
        .aggregate(b=Sum("bytes"))["b"]
        or 0
    )


def refusal_for(item: PlanItem, policy: Policy, to_be: dict | None = None) -> str | None:
    """Why ``item`` may not be approved now, or None. ``to_be``: ``inputs.holders_to_be()``.
    The budgets read the jobs in the database, those this decision created included (each
    counted once)."""
    target = item.target
    to_be = holders_to_be() if to_be is None else to_be
    already = to_be.get((chain_hex(item.prefix_keys), target.pk))
    if already:
        return f"one replica per prefix and engine: {already}"
    if target.node.state != NodeState.ACTIVE:
        return f"target node {target.node.name} is {target.node.state}"
    if target.lifecycle == EngineLifecycle.DRAINING:
        return f"target engine {target} is draining"
    overrides = active_overrides()
    if overrides.filter(kind=OverrideKind.EXCLUDE_NODE, node_id=target.node_id).exists():
        return f"node {target.node.name} is excluded by an override"
    if overrides.filter(kind=OverrideKind.EXCLUDE_ENGINE, engine_id=target.pk).exists():
        return f"engine {target} is excluded by an override"
    return _over_budget(item, Budgets.of(policy), policy.interval_s)


def _over_budget(item: PlanItem, budgets: Budgets, interval_s: int) -> str | None:
    """Why ``item`` would exceed the policy's budgets (the planner's, ``Budgets.of``), or None."""
    target = item.target
    cap = budgets.spec_cap_bytes(target.kv_capacity_bytes)
    used = spec_bytes_by_engine([target.pk]).get(target.pk, 0)
    if used + item.bytes > cap:
        return (
            f"speculative VRAM budget of {target}: {used + item.bytes:,} bytes would exceed "
            f"{budgets.max_spec_vram_fraction:.0%} of KV capacity ({cap:,.0f} bytes)"
        )
    moved = bytes_this_interval(interval_s)
    if moved + item.bytes > budgets.max_bytes_per_interval:
        return (
            f"transfer budget: {moved + item.bytes:,} bytes in {interval_s}s would exceed "
            f"{budgets.max_bytes_per_interval:,.0f}"
        )
    if item.confidence < budgets.min_confidence:
        return (
            f"confidence {item.confidence:.2f} is below the policy minimum "
            f"{budgets.min_confidence:.2f}"
        )
    return None


def holdout_fraction(policy: Policy) -> float:
    f = policy.holdout_fraction
    return float(settings.PREWARM_HOLDOUT_FRACTION if f is None else f)


def _hold_out(item: PlanItem, policy: Policy, now) -> SpeculativeReplica:
    """The control arm: an approved item withheld, recorded with what it would have done. Its
    hold starts when its copy would have landed (approval plus the item's placement cost), as a
    treated replica's starts when its copy landed."""
    tokens = item.prefix_tokens or len(item.prefix_keys) * item.target.block_size
    now = now + timedelta(seconds=max(0.0, item.cost_s))
    return SpeculativeReplica.objects.create(
        item=item,
        engine=item.target,
        workload_key_id=item.workload_key_id,
        prefix_keys=item.prefix_keys,
        tier=Transport.LANDS_IN.get(policy.default_transport, item.tier),
        bytes=item.bytes,
        bytes_moved=item.bytes,  # what it would have moved: it never did
        held_out=True,
        tokens=tokens,
        new_tokens=tokens,
        forecaster=item.plan.summary.get("forecasters", {}).get(str(item.workload_key_id), ""),
        placed_at=now,
        expires_at=now + timedelta(seconds=policy.replica_ttl_s),
    )


def _job_for(item: PlanItem, policy: Policy) -> ReplicationJob:
    job = ReplicationJob.objects.create(
        item=item,
        transport=policy.default_transport,
        source=item.source,
        target=item.target,
        prefix_keys=item.prefix_keys,
        tier=Transport.LANDS_IN.get(policy.default_transport, item.tier),
        bytes=item.bytes,
        max_attempts=settings.PREWARM_JOB_MAX_ATTEMPTS,
        deadline=timezone.now() + timedelta(seconds=policy.horizon_s),
    )
    job = transition(job, JobState.APPROVED, "approved with its plan item")
    transaction.on_commit(lambda: dispatch_job.delay(str(job.pk)))
    return job


@transaction.atomic
def decide_plan(
    plan_id: int, who, approve: bool, item_ids: list[int] | None = None, reason: str = ""
) -> tuple[ReplicationPlan, dict[int, str]]:
    """Approve or reject a plan or some of its items. Refused items say why and change nothing."""
    plan = (
        ReplicationPlan.objects.select_for_update(of=("self",))
        .select_related("policy")
        .get(pk=plan_id)
    )
    selected = _selected(plan, item_ids)
    before = {"state": plan.state}
    closed = _closed(plan, selected, approve)
    if closed is not None:
        return plan, closed
    now = timezone.now()
    user = getattr(who, "user", who)
    user = user if getattr(user, "is_authenticated", False) else None
    refused = _decide_items(plan, selected, approve, user, now)
    plan.state = _plan_state(plan)
    plan.decided_at, plan.decided_by = now, user
    plan.save(update_fields=["state", "decided_at", "decided_by"])
    record(
        who,
        "plan.approved" if approve else "plan.rejected",
        plan,
        before=before,
        after={
            "state": plan.state,
            "items": [i.pk for i in selected if i.pk not in refused],
            "refused": refused,
        },
        reason=reason,
    )
    publish_event(events.plan_decided(plan.pk, plan.state))
    return plan, refused


def _selected(plan: ReplicationPlan, item_ids: list[int] | None) -> list[PlanItem]:
    """The items named (all of them in the plan, or ``Invalid``), else the pending ones."""
    items = plan.items.select_related("target__node", "source")
    if not item_ids:
        return list(items.filter(decision=ItemDecision.PENDING))
    found = {i.pk: i for i in items.filter(pk__in=item_ids)}
    missing = set(item_ids) - set(found)
    if missing:
        raise Invalid(
            f"items {sorted(missing)} are not in plan {plan.pk}",
            code="unknown_items",
            field="items",
        )
    return list(found.values())


def _closed(plan: ReplicationPlan, selected: list[PlanItem], approve: bool) -> dict | None:
    """Why no item of ``selected`` can be decided now (per item), or None: the plan is no longer
    open, or (to approve) it is a shadow plan or a freeze is on."""
    if plan.state not in PlanState.OPEN:
        return {
            i.pk: f"plan is {plan.state}" for i in selected if i.decision == ItemDecision.PENDING
        }
    if approve and plan.mode == PolicyMode.SHADOW:
        return {
            i.pk: "shadow mode moves nothing: switch the policy to manual or auto" for i in selected
        }
    if approve and frozen():
        return {i.pk: "a freeze override is active" for i in selected}
    return None


def _decide_items(
    plan: ReplicationPlan, selected: list[PlanItem], approve: bool, user, now
) -> dict[int, str]:
    """Each pending item approved (a job, or held out) or rejected; returns the refused ones'
    reasons (an item decided the other way already, or over the budgets)."""
    refused: dict[int, str] = {}
    to_be = holders_to_be(now) if approve else {}
    share = holdout_fraction(plan.policy)
    arms = _arms(now) if approve and share > 0 else {}
    for item in selected:
        if item.decision != ItemDecision.PENDING:
            if (item.decision in (ItemDecision.APPROVED, ItemDecision.HELD_OUT)) != approve:
                refused[item.pk] = f"already {item.decision}"
            continue  # deciding the same way twice is harmless
        decision = ItemDecision.APPROVED if approve else ItemDecision.REJECTED
        if approve:
            why = refusal_for(item, plan.policy, to_be)
            if why:
                item.refusal = why
                item.save(update_fields=["refusal"])
                refused[item.pk] = why
                continue
            to_be[(chain_hex(item.prefix_keys), item.target_id)] = f"plan item #{item.pk}"
            decision = _approve(item, plan.policy, share, arms, now)
        item.decision = decision
        item.decided_by, item.decided_at, item.refusal = user, now, ""
        item.save(update_fields=["decision", "decided_by", "decided_at", "refusal", "holdout_draw"])
    return refused


def _approve(item: PlanItem, policy: Policy, share: float, arms: dict, now) -> str:
    """An approved item on its arm: a job handed to delivery, or held out (the control arm).
    Speculative items only are drawn (a pin is an operator's order, not a bet to measure)."""
    key = item.workload_key_id
    if key and share > 0 and key not in arms:
        draw = holdout.assign(policy, item, share, now)
        arms[key] = (draw.held_out, draw.pk)
    held, item.holdout_draw_id = arms.get(key, (False, None))
    if held:
        _hold_out(item, policy, now)
        return ItemDecision.HELD_OUT
    _job_for(item, policy)
    return ItemDecision.APPROVED


def _plan_state(plan: ReplicationPlan) -> str:
    """The plan's state from its items' decisions (a held-out item counts as approved)."""
    states = {
        ItemDecision.APPROVED if d == ItemDecision.HELD_OUT else d
        for d in plan.items.values_list("decision", flat=True)
    }
    if states == {ItemDecision.APPROVED}:
        return PlanState.APPROVED
    if states == {ItemDecision.REJECTED}:
        return PlanState.REJECTED
    if ItemDecision.APPROVED in states:
        return PlanState.PARTIAL
    return plan.state
