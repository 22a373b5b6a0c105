"""The live control plane's feed to the harm guard (``controlplane.core.policy.guard``): the same
signals the simulator reproduces (``controlplane.sim.guarded``), from the database.

The guard's state lives in the plans' summaries (``summary["guard"]["state"]``): each cycle reads
the latest plan of its policy that carries one, steps it on what happened since, and stores the
next state in its own plan. What it watches, since that plan:

- the copies that landed (``SpeculativeReplica`` rows, not shadow or held out, placed since):
  their target's queue now (the agents' last ``num_requests_waiting``, by the shared input rule)
  against the target's queue when the plan that made the copy was stored (its summary's
  ``queue_at_plan``), net of the mean rise of the other serving engines since;
- misses for the ``evicted`` reason on those targets since (``MissBucket``).

A plan made at ingest uses the last state and does not step it (the cycle's cadence paces the
guard). The gauge ``prewarm_plan_guard_allowed`` (``readmodels.metrics``) is the latest plan's
``allowed``.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Sum
from django.utils.dateparse import parse_datetime

from controlplane.core.policy import guard
from controlplane.core.policy.types import Budgets, PlannedMove
from controlplane.core.protocol import ENGINE_SERVING
from controlplane.demand.models import MissBucket

from ..models import Policy, ReplicationPlan, SpeculativeReplica
from .inputs import Inputs


def last_state(policy: Policy) -> tuple[guard.GuardState, datetime | None]:
    """The guard's state the latest plan of ``policy`` stored, and when it was observed."""
    for summary, created in (
        ReplicationPlan.objects.filter(policy=policy, summary__has_key="guard")
        .order_by("-created_at")
        .values_list("summary", "created_at")[:1]
    ):
        g = summary.get("guard") or {}
        at = parse_datetime(str(g.get("observed_at") or "")) or created
        return guard.GuardState.from_json(g.get("state")), at
    return guard.GuardState(), None


def signals(policy: Policy, inputs: Inputs, since: datetime) -> guard.Signals:
    """What the copies landed since ``since`` did (see the module doc)."""
    queue = {e.engine_id: e.queue_s for e in inputs.engines if e.lifecycle == ENGINE_SERVING}
    rows = list(
        SpeculativeReplica.objects.filter(
            item__plan__policy=policy, shadow=False, held_out=False, placed_at__gte=since
        ).values_list("engine_id", "workload_key_id", "item__plan__summary")
    )
    tenant = {key.pk: key.tenant for key in inputs.keys.values()}
    landed = []
    for engine_id, key_id, plan_summary in rows:
        eid = str(engine_id)
        if eid not in queue:
            continue
        then = ((plan_summary or {}).get("guard") or {}).get("queue_at_plan", {})
        before = then.get(eid)
        rises = [queue[k] - q for k, q in then.items() if k != eid and k in queue]
        landed.append(
            guard.Landed(
                target=eid,
                group=str(tenant.get(key_id, key_id)),  # the candidates' prefix group
                queue_before_s=float(before) if isinstance(before, int | float) else None,
                queue_after_s=queue[eid],
                peers_rise_s=sum(rises) / len(rises) if rises else 0.0,
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
    return guard.Signals(landed=landed, evicted_misses=evicted)


def state_for(
    policy: Policy, inputs: Inputs, budgets: Budgets, now: datetime, *, step: bool
) -> tuple[guard.GuardState, datetime]:
    """The guard's state this plan applies: the last one, stepped on what happened since it was
    observed where ``step`` (the plan cycle); and when it was observed."""
    state, at = last_state(policy)
    if not step:
        return state, at or now
    if at is not None:
        state = guard.observe(
            state, signals(policy, inputs, at), limit_s=guard.queue_limit_s(budgets)
        )
    return state, now


def summary(
    state: guard.GuardState,
    observed_at: datetime,
    inputs: Inputs,
    planned: list[PlannedMove],
    items: list[PlannedMove],
) -> dict:
    """The plan summary's ``guard``: how much speculation is allowed now and why, the state the
    next cycle steps, and its targets' queues now (what their copies are compared with)."""
    queue = {e.engine_id: e.queue_s for e in inputs.engines if e.lifecycle == ENGINE_SERVING}
    out = guard.summary(state, planned=len(planned), admitted=len(items))
    out["observed_at"] = observed_at.isoformat()
    # every serving engine's: a target's rise is compared with the others' (no copy there)
    out["queue_at_plan"] = {k: round(q, 4) for k, q in queue.items()}
    return out
