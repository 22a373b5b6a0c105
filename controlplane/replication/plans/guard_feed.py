"""The live control plane's feed to the harm guard (``controlplane.core.policy.harm_guard``): the same
signals the simulator reproduces (``controlplane.sim.guarded``), from the database.

The guard's state lives in the plans' summaries (``summary["guard"]["state"]``): each cycle reads
the latest plan of its policy that carries one, steps it on what happened since, and stores the
next state in its own plan. What it watches, since that plan:

- the copies that landed (``SpeculativeReplica`` rows, not shadow or held out, placed since):
  their target's queue now (the agents' last ``num_requests_waiting``, by the shared input rule)
  against the target's queue when the plan that made the copy was stored (its summary's
  ``queue_at_plan``), net of the mean rise of the other serving engines since;
- each such copy's time (its plan's creation to its placement, when its job succeeded) against
  its lead: planning to the first request of its prefix its target served while the copy was in
  flight (the ``warming`` miss reason, ``MissBucket``; to its bucket's start, at most the bucket's
  length early). No such request: the lead is unknown (infinite), the copy was in time;
- misses for the ``evicted`` reason on those targets since (``MissBucket``);
- per prefix group, the holdout's per-request mean TTFT of the treated and of the held-out
  assignments whose windows closed since, and the 95% interval of their difference
  (``plans.holdout_ttft``, the measure the scoreboard shows), where both arms measured enough
  for one: each assignment counts once, whole.

A plan made at ingest uses the last state and does not step it (the cycle's cadence paces the
guard). The gauge ``prewarm_plan_guard_allowed`` (``readmodels.metrics``) is the latest plan's
``allowed``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Sum
from django.utils.dateparse import parse_datetime

from controlplane.core import stats
from controlplane.core.policy import harm_guard
from controlplane.core.policy.types import Budgets, PlannedMove
from controlplane.demand.models import MissBucket, WorkloadKey
from wire.protocol import ENGINE_SERVING

from ..models import Policy, ReplicationPlan, SpeculativeReplica
from . import holdout_ttft
from .inputs import Inputs


def last_state(policy: Policy) -> tuple[harm_guard.GuardState, datetime | None]:
    """The guard's state the latest plan of ``policy`` stored, and when it was observed."""
    for summary, created in (
        ReplicationPlan.objects.filter(policy=policy, summary__has_key="guard")
        .order_by("-created_at")
        .values_list("summary", "created_at")[:1]
    ):
        g = summary.get("guard") or {}
        at = parse_datetime(str(g.get("observed_at") or "")) or created
        return harm_guard.GuardState.from_json(g.get("state")), at
    return harm_guard.GuardState(), None


def signals(policy: Policy, inputs: Inputs, since: datetime, now: datetime) -> harm_guard.Signals:
    """What the copies landed since ``since`` did, and the holdout's assignments closed since
    (see the module doc)."""
    queue = {e.engine_id: e.queue_s for e in inputs.engines if e.lifecycle == ENGINE_SERVING}
    rows = list(
        SpeculativeReplica.objects.filter(
            item__plan__policy=policy, shadow=False, held_out=False, placed_at__gte=since
        ).values_list(
            "engine_id",
            "workload_key_id",
            "item__plan__summary",
            "item__plan__created_at",
            "placed_at",
        )
    )
    group_of = _groups(inputs)
    leads = _leads([(k, e, planned, placed) for e, k, _, planned, placed in rows])
    landed = []
    for engine_id, key_id, plan_summary, planned, placed in rows:
        eid = str(engine_id)
        if eid not in queue:
            continue
        then = ((plan_summary or {}).get("guard") or {}).get("queue_at_plan", {})
        before = then.get(eid)
        rises = [queue[k] - q for k, q in then.items() if k != eid and k in queue]
        landed.append(
            harm_guard.Landed(
                target=eid,
                group=group_of(key_id),  # the candidates' prefix group
                queue_before_s=float(before) if isinstance(before, int | float) else None,
                queue_after_s=queue[eid],
                peers_rise_s=sum(rises) / len(rises) if rises else 0.0,
                copy_s=max(0.0, (placed - planned).total_seconds()),
                lead_s=leads.get((key_id, engine_id), math.inf),
            )
        )
    targets = {int(c.target) for c in landed}
    evicted = {
        str(e): int(n or 0)
        for e, n in MissBucket.objects.filter(engine_id__in=targets, start__gte=since)
        .values_list("engine_id")
        .annotate(n=Sum("evicted"))
        .order_by()
    }
    return harm_guard.Signals(
        landed=landed,
        evicted_misses=evicted,
        ttft=treated_vs_held_out(policy, since, now, group_of),
    )


def _groups(inputs: Inputs) -> Callable[[int | None], str]:
    """A workload key's prefix group (the candidates' ``workload_key``: its tenant), for keys
    the inputs name and, read once, for others."""
    tenant = {key.pk: key.tenant for key in inputs.keys.values()}

    def group_of(key_id: int | None) -> str:
        if key_id not in tenant and key_id is not None:
            found = WorkloadKey.objects.filter(pk=key_id).values_list("tenant", flat=True).first()
            tenant[key_id] = found if found is not None else str(key_id)
        return str(tenant.get(key_id, key_id))

    return group_of


def _leads(copies: list[tuple]) -> dict[tuple, float]:
    """Per (key id, target id) of ``copies`` (key id, target id, planned at, placed at): seconds
    from planning to the first ``warming`` miss of the key on the target while the copy was in
    flight, from its bucket's start (at most its length early, not before planning)."""
    copies = [c for c in copies if c[0] is not None]
    if not copies:
        return {}
    # Copies since the last cycle fall in fine buckets (hourly roll-ups are days old).
    longest = settings.PREWARM_DEMAND_BUCKET_SECONDS
    buckets = MissBucket.objects.filter(
        key_id__in={c[0] for c in copies},
        engine_id__in={c[1] for c in copies},
        warming__gt=0,
        start__lte=max(c[3] for c in copies),
        start__gt=min(c[2] for c in copies) - timedelta(seconds=longest),
    ).values_list("key_id", "engine_id", "start", "seconds")
    by_pair: dict[tuple, list] = {}
    for key, engine, start, seconds in buckets:
        by_pair.setdefault((key, engine), []).append((start, seconds))
    out = {}
    for key, engine, planned, placed in copies:
        starts = [
            st
            for st, sec in by_pair.get((key, engine), ())
            if st <= placed and st + timedelta(seconds=sec) > planned
        ]
        if starts:
            out[(key, engine)] = max(0.0, (min(starts) - planned).total_seconds())
    return out


def treated_vs_held_out(
    policy: Policy, since: datetime, now: datetime, group_of: Callable[[int | None], str]
) -> dict[str, harm_guard.Compared]:
    """Per prefix group: the holdout's treated against held-out per-request TTFT of the
    assignments of ``policy`` whose windows closed in (since, now], with the 95% interval of
    the difference (the holdout's own estimand); groups without an interval are left out."""
    arms: dict[str, tuple[list, list]] = {}
    for u in holdout_ttft.closed(policy.pk, since, now):
        if u["key"] is not None:
            arms.setdefault(group_of(u["key"]), ([], []))[bool(u["held_out"])].append(u)
    out = {}
    for group, (treated, held) in arms.items():
        t, h = holdout_ttft.arm_mean(treated), holdout_ttft.arm_mean(held)
        ci = stats.difference(t, h)
        if t is not None and h is not None and ci is not None:
            out[group] = harm_guard.Compared(
                treated_s=t.estimate, held_out_s=h.estimate, diff_low_s=ci.low
            )
    return out


def state_for(
    policy: Policy, inputs: Inputs, budgets: Budgets, now: datetime, *, step: bool
) -> tuple[harm_guard.GuardState, datetime]:
    """The guard's state this plan applies: the last one, stepped on what happened since it was
    observed where ``step`` (the plan cycle); and when it was observed."""
    state, at = last_state(policy)
    if not step:
        return state, at or now
    if at is not None:
        state = harm_guard.observe(
            state, signals(policy, inputs, at, now), limit_s=harm_guard.queue_limit_s(budgets)
        )
    return state, now


def summary(
    state: harm_guard.GuardState,
    observed_at: datetime,
    inputs: Inputs,
    planned: list[PlannedMove],
    items: list[PlannedMove],
) -> dict:
    """The plan summary's ``guard``: how much speculation is allowed now and why, the state the
    next cycle steps, and its targets' queues now (what their copies are compared with)."""
    queue = {e.engine_id: e.queue_s for e in inputs.engines if e.lifecycle == ENGINE_SERVING}
    out = harm_guard.summary(state, planned=len(planned), admitted=len(items))
    out["observed_at"] = observed_at.isoformat()
    # every serving engine's: a target's rise is compared with the others' (no copy there)
    out["queue_at_plan"] = {k: round(q, 4) for k, q in queue.items()}
    return out
