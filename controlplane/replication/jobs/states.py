"""The one place job states change: legal transitions enforced, each one recorded."""

from __future__ import annotations

from django.db import transaction

from controlplane.core.errors import Conflict

from ..choices import JobState
from ..models import JobTransition, ReplicationJob


class IllegalTransition(Conflict, ValueError):
    """A job state change the state machine does not allow (409 on the API)."""

    code = "illegal_transition"

    def __init__(self, detail: str):
        super().__init__(detail, field="state")


def can_transition(current: str, to: str) -> bool:
    return to in JobState.ALLOWED.get(current, set())


@transaction.atomic
def transition(job: ReplicationJob, to: str, detail: str = "", **fields) -> ReplicationJob:
    """Move ``job`` to state ``to`` (row-locked), recording the transition; raises IllegalTransition."""
    locked = ReplicationJob.objects.select_for_update().get(pk=job.pk)
    if locked.state == to and not fields:
        return locked  # idempotent: the same message delivered twice
    if not can_transition(locked.state, to):
        raise IllegalTransition(f"job {locked.pk}: {locked.state} -> {to} is not allowed")
    if to in (JobState.FAILED, JobState.EXPIRED) and "error" not in fields:
        fields["error"] = detail[:2000]  # a job that ended badly says why, in the table and the API
    elif to in (JobState.LANDED, JobState.SUCCEEDED) and "error" not in fields:
        fields["error"] = ""  # this attempt worked: an earlier one's error is history (transitions)
    JobTransition.objects.create(
        job=locked, from_state=locked.state, to_state=to, detail=detail[:2000]
    )
    locked.state = to
    for name, value in fields.items():
        setattr(locked, name, value)
    locked.save()
    job.__dict__.update(locked.__dict__)
    return locked
