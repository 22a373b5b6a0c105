"""Policies and overrides (audited), the overrides in force, and retention of finished work.

Plan decisions and their budgets are ``plans.decisions``; job cancels ``jobs.delivery``."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.audit.services import delete_audited, record, save_audited, snapshot
from controlplane.core.errors import Conflict

from .choices import JobState, OverrideKind, PlanState
from .models import Override, Policy, ReplicationJob, ReplicationPlan


def active_overrides():
    now = timezone.now()
    return Override.objects.filter(active=True).exclude(expires_at__lt=now)


def frozen() -> bool:
    return active_overrides().filter(kind=OverrideKind.FREEZE).exists()


@transaction.atomic
def save_policy(policy: Policy, who, *, reason: str = "") -> Policy:
    """Create or update ``policy`` (its fields already set), audited. The one rule for the
    active policy: saving an active one deactivates every other, each deactivation audited."""
    action = "policy.updated" if policy.pk is not None else "policy.created"
    if policy.active:
        others = Policy.objects.select_for_update().filter(active=True)
        if policy.pk is not None:
            others = others.exclude(pk=policy.pk)
        for other in others:
            before = snapshot(other)
            other.active = False
            other.save(update_fields=["active", "updated_at"])
            record(
                who,
                "policy.deactivated",
                other,
                before=before,
                after=snapshot(other),
                reason=f"{policy.name} activated",
            )
    return save_audited(policy, who, action, reason=reason)


def activate_policy(policy: Policy, who, *, reason: str = "") -> Policy:
    """Make ``policy`` the one the planner uses."""
    policy.active = True
    return save_policy(policy, who, reason=reason)


@transaction.atomic
def delete_policy(policy: Policy, who, *, reason: str = "") -> None:
    """Delete a policy no plan refers to (one with plans is deactivated instead)."""
    if policy.plans.exists():
        raise Conflict("this policy has plans; deactivate it instead", code="in_use")
    delete_audited(policy, who, "policy.deleted", reason=reason)


def save_override(override: Override, who, *, reason: str = "") -> Override:
    """Create or update an override (pin, exclusion, freeze), audited."""
    action = "override.updated" if override.pk is not None else "override.created"
    return save_audited(override, who, action, reason=reason)


def delete_override(override: Override, who, *, reason: str = "") -> None:
    delete_audited(override, who, "override.deleted", reason=reason)


@transaction.atomic
def prune_finished(now=None) -> dict:
    """Finished jobs (their transitions cascade) and decided plans (their items cascade) older
    than PREWARM_JOB_KEEP_DAYS. Replicas stay (they hold the scores) and lose the link."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.PREWARM_JOB_KEEP_DAYS)
    jobs, by_model = ReplicationJob.objects.filter(
        state__in=JobState.TERMINAL, updated_at__lt=cutoff
    ).delete()
    plans, _ = (
        ReplicationPlan.objects.filter(created_at__lt=cutoff)
        .exclude(state=PlanState.PROPOSED)
        .delete()
    )
    return {
        "jobs_deleted": by_model.get("replication.ReplicationJob", 0),
        "job_transitions_deleted": by_model.get("replication.JobTransition", 0),
        "plans_deleted": plans,
    }
