"""Workflow tasks: tick (policy cadences), plan, dispatch, sweeps, TTL eviction, scoring.

Each takes ids, is idempotent (a second run finds nothing left to do) and logs and returns when
its object vanished. Each names its queue where it is defined (``controlplane.queues``).
"""

from __future__ import annotations

import logging

from controlplane.forecasting.tasks import forecast_all
from controlplane.queues import Queue, task

from . import scoring
from .choices import PolicyStrategy
from .jobs import delivery, expiry
from .jobs.delivery import dispatch_job as dispatch_job
from .models import Policy
from .plans import cycle
from .plans.react import react_to_ingest as react_to_ingest
from .services import prune_finished

# dispatch_job and react_to_ingest are defined beside what they run (jobs.delivery,
# plans.react) and named as this module's.

log = logging.getLogger(__name__)


@task(Queue.DEFAULT)
def tick() -> dict:
    """Start forecast and plan cycles when the active policy's cadences say they are due.

    The plan cadence is the same under either strategy: a due plan runs on the demand measured
    now and the latest forecasts, whether or not a forecast is due or still running (a forecast
    slower than its cadence must not hold back the copies measured demand asks for). A due
    forecast is followed by a plan of its own, so fresh forecasts are planned on at once."""
    policy = Policy.objects.filter(active=True).first()
    if policy is None or policy.strategy == PolicyStrategy.OFF:
        return {}
    due = cycle.due(policy)
    if policy.strategy == PolicyStrategy.REACTIVE:
        due["forecast"] = False  # measured demand only: nothing to forecast
    if due["forecast"]:
        forecast_then_plan(policy)
    if due["plan"]:
        plan_cycle.delay(policy.pk)
    return due


def forecast_then_plan(policy: Policy):
    """The cycle as one Celery chain: forecast every active key in one task, then plan (the
    count of keys forecast travels in the plan task's message)."""
    return (forecast_all.si(float(policy.horizon_s)) | plan_after_forecasts.s(policy.pk)).delay()


@task(Queue.PLAN)
def plan_after_forecasts(done: int, policy_id: int | None = None) -> int | None:
    """The chain's second step: ``done`` is how many keys got a forecast. Nothing forecast,
    nothing new to plan on: the plan cadence plans on its own."""
    if not done:
        return None
    return plan_cycle(policy_id)


@task(Queue.PLAN)
def plan_cycle(policy_id: int | None = None) -> int | None:
    plan = cycle.run_cycle(policy_id)
    return plan.pk if plan else None


@task(Queue.DISPATCH)
def sweep_jobs() -> dict:
    return delivery.sweep()


@task(Queue.DISPATCH)
def evict_expired() -> int:
    return expiry.evict_expired()


@task(Queue.DEFAULT)
def score_replicas() -> int:
    return scoring.score_all()


@task(Queue.DEFAULT)
def retention() -> dict:
    """Finished jobs with their transitions and decided plans past PREWARM_JOB_KEEP_DAYS."""
    return prune_finished()
