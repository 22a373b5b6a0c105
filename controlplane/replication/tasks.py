"""Workflow tasks: tick (policy cadences), plan, dispatch, sweeps, TTL eviction, scoring.

Each takes ids, is idempotent (a second run finds nothing left to do) and logs and returns when
its object vanished. Queues: see ``controlplane.celery.TASK_QUEUES``.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.forecasting.tasks import forecast_all

from . import dispatch, planning, scoring
from .choices import JobAction, JobState, Transport
from .dispatch import dispatch_job
from .jobstates import transition
from .models import Policy, ReplicationJob, SpeculativeReplica

log = logging.getLogger(__name__)


@shared_task
def tick() -> dict:
    """Start forecast and plan cycles when the active policy's cadences say they are due."""
    policy = Policy.objects.filter(active=True).first()
    if policy is None:
        return {}
    due = planning.due(policy)
    if due["forecast"]:
        forecast_then_plan(policy)
    elif due["plan"]:
        plan_cycle.delay(policy.pk)
    return due


def forecast_then_plan(policy: Policy):
    """The cycle as one Celery chain: forecast every active key (fanned out over the forecast
    workers), then plan once all of them are in. Returns the chain's AsyncResult."""
    return (
        forecast_all.si(float(policy.horizon_seconds)) | plan_after_forecasts.s(policy.pk)
    ).delay()


@shared_task
def plan_after_forecasts(done: int | list[int], policy_id: int | None = None) -> int | None:
    """The chain's second step: ``done`` is how many keys got a forecast (per batch). Nothing
    forecast, nothing new to plan on: the plan cadence plans on its own."""
    if not (sum(done) if isinstance(done, list) else done):
        return None
    return plan_cycle(policy_id)


@shared_task
def plan_cycle(policy_id: int | None = None) -> int | None:
    plan = planning.run_cycle(policy_id)
    return plan.pk if plan else None


@shared_task
def sweep_jobs() -> dict:
    return dispatch.sweep()


# No per-prefix evict: vLLM has no API to drop a prefix (a warmed prefix stays ordinary prefix
# cache, evicted LRU when room is needed), and LMCache 0.5.6's controller has none either (its
# /clear empties a whole tier); an LMCache replica ends by its lease lapsing, as the agent stops
# renewing it at the hold's end.
ENDS_BY_ITSELF = (Transport.WARMUP, Transport.LMCACHE)


@shared_task
def evict_expired() -> int:
    """Replicas past their TTL: shadow ones, and those whose executor cannot evict (warm-ups,
    LMCache leases), simply end; the others are evicted through their agent."""
    now = timezone.now()
    expired = SpeculativeReplica.objects.filter(evicted_at__isnull=True, expires_at__lte=now)
    ended = expired.filter(shadow=True).update(evicted_at=F("expires_at"))
    ended += expired.filter(shadow=False, job__transport__in=ENDS_BY_ITSELF).update(
        evicted_at=F("expires_at")
    )
    pinned = _pinned_chains()
    for r in expired.filter(shadow=False).select_related("engine", "job"):
        if tuple(r.prefix_keys) in pinned.get(r.engine_id, set()):
            continue  # a pin keeps it
        with transaction.atomic():
            if ReplicationJob.objects.filter(
                action=JobAction.EVICT,
                target_id=r.engine_id,
                prefix_keys=r.prefix_keys,
                state__in=[JobState.APPROVED, *dispatch.DELIVERY_STATES],
            ).exists():
                continue  # an eviction is already under way
            job = ReplicationJob.objects.create(
                item=r.item,  # its workload key gives executors that address KV by tokens the tokens
                action=JobAction.EVICT,
                transport=r.job.transport if r.job_id else "tcp",
                target=r.engine,
                prefix_keys=r.prefix_keys,
                tier=r.tier,
                bytes=0,
                deadline=now + timedelta(minutes=10),
            )
            transition(job, JobState.APPROVED, f"replica #{r.pk} passed its TTL")
            transaction.on_commit(lambda j=job: dispatch_job.delay(str(j.pk)))
            ended += 1
    return ended


def _pinned_chains() -> dict[int, set[tuple]]:
    from .choices import OverrideKind
    from .services import active_overrides

    out: dict[int, set[tuple]] = {}
    for o in active_overrides().filter(kind=OverrideKind.PIN):
        out.setdefault(o.engine_id, set()).add(tuple(o.prefix_keys))
    return out


@shared_task
def score_replicas() -> int:
    return scoring.score_all()


@shared_task
def retention() -> dict:
    """Finished jobs with their transitions and decided plans past PREWARM_JOB_KEEP_DAYS."""
    from .services import prune_finished

    return prune_finished()
