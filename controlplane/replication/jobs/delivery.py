"""Jobs to agents and agents' events back: delivery, acknowledgement, results, retries, expiry.

Every state change goes through ``states.transition``; every push goes through ``publish`` (on
commit) to the agent's Channels group, which its websocket consumer or long-poll request reads.
Delivery is idempotent by job id and attempt: an agent that acknowledged an attempt is not sent
it again; one that did not is sent it again after ``PREWARM_JOB_REDELIVER_SECONDS``.

Messages and roles are ``messages.py``'s. The target's ``succeeded`` (after it verified
the checksum, where its executor has one) makes a replicate job ``landed``: the copy is recorded
as a replica awaiting confirmation, and the control plane never writes it into the residency
index itself. ``confirm.py`` confirms it when the target engine shows it (its KV events in the
index, or an LMCache pin / directory result the executor reports) and marks it unconfirmed or
lost otherwise.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.audit.services import record
from controlplane.fleet.choices import NodeState
from controlplane.fleet.models import Engine
from controlplane.queues import Queue, task
from controlplane.realtime import groups
from controlplane.realtime.publish import publish, publish_event
from wire import protocol

from ..choices import JobAction, JobState, Transport
from ..models import ReplicationJob, SpeculativeReplica
from . import confirm
from .messages import (
    SOURCE,
    TARGET,
    EventError,
    assign_message,
    check_event,
    job_update,
    roles_of,
    tokens_for,
)
from .states import IllegalTransition, transition

log = logging.getLogger(__name__)
DELIVERY_STATES = (JobState.DISPATCHED, JobState.RUNNING)  # sent; agents at work


def _node_ok(engine: Engine | None) -> bool:
    return engine is not None and engine.node.state == NodeState.ACTIVE


def dispatch(job_id) -> ReplicationJob | None:
    """Send an approved job to its agents: approved -> dispatched, attempt + 1."""
    with transaction.atomic():
        # of=self: PostgreSQL cannot lock the nullable side of the outer join to an evict job's source.
        job = (
            ReplicationJob.objects.select_for_update(of=("self",))
            .select_related("source__node", "target__node")
            .filter(pk=job_id)
            .first()
        )
        if job is None:
            log.info("dispatch: job %s vanished", job_id)
            return None
        if job.state != JobState.APPROVED:
            return job  # already dispatched, or finished: a duplicate task is harmless
        if job.retry_at and job.retry_at > timezone.now():
            return job  # backing off; the sweep dispatches it when the time comes
        roles = roles_of(job)
        gone = [r for r, e in roles.items() if not _node_ok(e)] or ([] if roles else [TARGET])
        if gone:
            return transition(job, JobState.EXPIRED, f"agent of the {', '.join(gone)} is gone")
        if (
            job.action == JobAction.REPLICATE
            and job.transport in Transport.NEEDS_TOKENS
            and tokens_for(job) is None
        ):
            job = transition(
                job,
                JobState.DISPATCHED,
                f"attempt {job.attempt + 1}: not sent",
                attempt=job.attempt + 1,
                dispatched_at=timezone.now(),
                acks={},
                results={},
            )
            return fail(
                job,
                f"the {job.transport} executor needs the prefix's token ids, and none "
                "are known for it: gateways must send token_ids (not only keys) for this "
                "workload key, and PREWARM_KEEP_PREFIX_TOKEN_IDS must be on",
            )
        held = confirm.held_at_dispatch(job)
        if held and len(held) == len(job.prefix_keys):
            return confirm.redundant(
                job, "the target held the whole prefix at dispatch: nothing to copy"
            )
        now = timezone.now()
        attempt_s = settings.PREWARM_JOB_ATTEMPT_SECONDS
        deadline = (
            min(job.deadline, now + timedelta(seconds=attempt_s))
            if job.deadline
            else now + timedelta(seconds=attempt_s)
        )
        job = transition(
            job,
            JobState.DISPATCHED,
            f"attempt {job.attempt + 1} sent to agents",
            attempt=job.attempt + 1,
            dispatched_at=now,
            acks={},
            results={},
            bytes_done=0,
            retry_at=None,
            attempt_deadline=deadline,
            held_at_dispatch=held,
            stored_since=[],
            stored_seqs={},
            target_report_seq=None,
        )
        _push(job, roles)
    return job


def _push(job: ReplicationJob, roles: dict[str, Engine]) -> None:
    for role, engine in roles.items():
        publish(groups.agent(engine.node_id), protocol.MSG_JOB_ASSIGN, assign_message(job, role))
    publish_event(job_update(job))


def pending_for_node(node_id: int) -> list[dict]:
    """``job.assign`` messages this node has not acknowledged yet (long-poll, websocket connect)."""
    out = []
    jobs = (
        ReplicationJob.objects.filter(state__in=DELIVERY_STATES)
        .select_related("source__node", "target__node")
        .filter(Q(source__node_id=node_id) | Q(target__node_id=node_id))
    )
    for job in jobs:
        for role, engine in roles_of(job).items():
            if engine.node_id == node_id and job.acks.get(role) != job.attempt:
                out.append(assign_message(job, role))
    return out


def apply_event(node_id: int, msg: dict) -> ReplicationJob | None:
    """Apply one agent event (job.ack / job.progress / job.result) from ``node_id``."""
    check_event(msg)
    kind = msg.get("type")
    with transaction.atomic():
        # of=self: PostgreSQL cannot lock the nullable side of the outer join to an evict job's source.
        job = (
            ReplicationJob.objects.select_for_update(of=("self",))
            .select_related("source__node", "target__node")
            .filter(pk=msg.get("job_id"))
            .first()
        )
        if job is None:
            raise EventError(f"unknown job {msg.get('job_id')!r}", status=404)
        roles = [r for r, e in roles_of(job).items() if e.node_id == node_id]
        if not roles:
            raise EventError(f"job {job.pk} does not involve this node", status=404)
        if kind == protocol.MSG_JOB_CONFIRM:
            if TARGET not in roles:
                raise EventError("only the target's agent confirms a copy")
            return confirm.on_agent_confirmation(job, msg)
        if job.state in JobState.TERMINAL:
            return job  # a late event for a cancelled/expired/finished job changes nothing
        if kind == protocol.MSG_JOB_ACK:
            acks = dict(job.acks)
            for r in roles:
                acks[r] = job.attempt
            job.acks = acks
            job.save(update_fields=["acks", "updated_at"])
            if TARGET in roles and msg.get("report_seq") is not None:
                confirm.on_target_cut(job, _report_seq(msg["report_seq"]))
            if job.state == JobState.DISPATCHED:
                job = transition(job, JobState.RUNNING, f"acknowledged by node {node_id}")
        elif kind == protocol.MSG_JOB_PROGRESS:
            done = int(msg.get("bytes_done") or 0)
            if TARGET in roles and done > job.bytes_done:
                job.bytes_done = min(done, job.bytes or done)
                job.save(update_fields=["bytes_done", "updated_at"])
        else:
            job = _result(job, node_id, roles, msg)
        publish_event(job_update(job))
    return job


def _report_seq(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EventError(
            f"{protocol.MSG_JOB_ACK} report_seq must be a report's seq (an integer >= 0)",
            field="report_seq",
        )
    return value


def _result(job: ReplicationJob, node_id: int, roles: list[str], msg: dict) -> ReplicationJob:
    state = msg.get("state")
    if state not in protocol.RESULT_STATES:
        raise EventError(
            f"{protocol.MSG_JOB_RESULT} state must be {' or '.join(protocol.RESULT_STATES)}"
        )
    results = dict(job.results)
    for r in roles:
        results[r] = {
            **{k: msg.get(k) for k in ("state", "checksum", "bytes", "error")},
            **{k: msg[k] for k in RESULT_EXTRA if msg.get(k) is not None},
        }
    job.results = results
    job.save(update_fields=["results", "updated_at"])
    if state == JobState.FAILED:
        if not any(job.acks.get(r) == job.attempt for r in roles):
            return job  # the failure of an earlier attempt, reported after its retry was sent
        return fail(job, f"{'/'.join(roles)} on node {node_id}: {msg.get('error') or 'failed'}")
    if TARGET not in roles:
        return job  # the source finished sending; only the target's result counts
    src = results.get(SOURCE) or {}
    if src.get("checksum") and msg.get("checksum") and src["checksum"] != msg["checksum"]:
        return fail(job, "target checksum differs from the source's")
    if job.state == JobState.DISPATCHED:
        job = transition(job, JobState.RUNNING, "result before acknowledgement")
    # Bytes moved are what the executor reports, never the plan's nominal size.
    moved = max(0, int(msg.get("bytes") or 0))
    if job.action == JobAction.EVICT:
        job = transition(job, JobState.SUCCEEDED, f"evicted by node {node_id}", bytes_done=moved)
        _on_evicted(job)
        return job
    job = transition(
        job,
        JobState.LANDED,
        f"landed: the {job.transport} executor on node {node_id} "
        "finished; awaiting the target engine's confirmation",
        checksum=str(msg.get("checksum") or "")[:64],
        bytes_done=moved,
    )
    confirm.on_landed(job, msg.get("confirmation"))
    return job


# What executors may add to a result (docs/agent-protocol.md).
RESULT_EXTRA = ("executor", "confirmation", "cached_tokens", "prompt_tokens", "detail")


def _on_evicted(job: ReplicationJob) -> None:
    # The residency index changes only when the engine's own events say so (no assumption here).
    SpeculativeReplica.objects.filter(
        job__isnull=False,
        engine_id=job.target_id,
        prefix_keys=job.prefix_keys,
        evicted_at__isnull=True,
        shadow=False,
    ).update(evicted_at=timezone.now())


def backoff_s(attempt: int) -> float:
    base = settings.PREWARM_JOB_BACKOFF_SECONDS
    return min(settings.PREWARM_JOB_BACKOFF_MAX_SECONDS, base * 2 ** max(0, attempt - 1))


def fail(job: ReplicationJob, why: str) -> ReplicationJob:
    """Fail the current attempt; retry after a backoff while attempts remain."""
    job = transition(job, JobState.FAILED, why, error=why[:2000])
    _cancel_on_agents(job)
    if job.attempt < job.max_attempts and (job.deadline is None or job.deadline > timezone.now()):
        delay = backoff_s(job.attempt)
        job = transition(
            job,
            JobState.APPROVED,
            f"retry {job.attempt + 1}/{job.max_attempts} in {delay:.1f}s",
            retry_at=timezone.now() + timedelta(seconds=delay),
        )
        transaction.on_commit(lambda: dispatch_job.apply_async((str(job.pk),), countdown=delay))
    return job


def _cancel_on_agents(job: ReplicationJob) -> None:
    for engine in roles_of(job).values():
        publish(
            groups.agent(engine.node_id), protocol.MSG_JOB_CANCEL, protocol.job_cancel(str(job.pk))
        )


def end(job: ReplicationJob, to: str, why: str) -> ReplicationJob | None:
    """Cancel or expire a job at any step before it finished; tells its agents."""
    try:
        job = transition(job, to, why)
    except IllegalTransition:
        return None
    _cancel_on_agents(job)
    publish_event(job_update(job, why))
    return job


def sweep(now=None) -> dict:
    """Expire jobs whose agent is gone or whose time ran out; redeliver unacknowledged ones;
    dispatch approved jobs whose backoff is over; judge landed copies whose confirmation window
    ended, and mark lost the confirmed ones that left their engine (``confirm.sweep``)."""
    now = now or timezone.now()
    expired = failed = redelivered = due = 0
    live = ReplicationJob.objects.filter(
        state__in=[JobState.APPROVED, *DELIVERY_STATES]
    ).select_related("source__node", "target__node")
    redeliver_before = now - timedelta(seconds=settings.PREWARM_JOB_REDELIVER_SECONDS)
    for job in live:
        with transaction.atomic():
            roles = roles_of(job)
            gone = [r for r, e in roles.items() if not _node_ok(e)]
            if gone or not roles:
                expired += bool(
                    end(
                        job, JobState.EXPIRED, f"agent of the {', '.join(gone) or 'target'} is gone"
                    )
                )
            elif job.deadline and job.deadline <= now:
                expired += bool(end(job, JobState.EXPIRED, _deadline_passed(job)))
            elif (
                job.state in DELIVERY_STATES
                and job.attempt_deadline
                and job.attempt_deadline <= now
            ):
                fail(
                    job,
                    f"attempt {job.attempt} took longer than {settings.PREWARM_JOB_ATTEMPT_SECONDS:.0f}s",
                )
                failed += 1
            elif job.state == JobState.APPROVED and (job.retry_at is None or job.retry_at <= now):
                due += 1
                transaction.on_commit(lambda j=job: _dispatch_later(j.pk))
            elif (
                job.state in DELIVERY_STATES
                and job.dispatched_at
                and job.dispatched_at < redeliver_before
                and any(job.acks.get(r) != job.attempt for r in roles)
            ):
                ReplicationJob.objects.filter(pk=job.pk).update(dispatched_at=now)
                for role, engine in roles.items():
                    if job.acks.get(role) != job.attempt:
                        publish(
                            groups.agent(engine.node_id),
                            protocol.MSG_JOB_ASSIGN,
                            assign_message(job, role),
                        )
                redelivered += 1
    return {
        JobState.EXPIRED: expired,
        JobState.FAILED: failed,
        "redelivered": redelivered,
        JobState.DISPATCHED: due,
        **confirm.sweep(now),
    }


def _deadline_passed(job: ReplicationJob) -> str:
    """Why a job expired by its deadline: in which state, and what held it up."""
    why = f"deadline passed while {job.state}"
    if job.state == JobState.APPROVED and job.attempt:
        why += f", waiting to retry after attempt {job.attempt}/{job.max_attempts}"
        if job.error:
            why += f" failed: {job.error}"
    elif job.state == JobState.APPROVED:
        why += ", never dispatched"
    elif job.state == JobState.DISPATCHED:
        unacked = [r for r in roles_of(job) if job.acks.get(r) != job.attempt]
        why += f" (attempt {job.attempt}), not acknowledged by the {', '.join(unacked) or 'agents'}"
    elif job.state == JobState.RUNNING:
        why += f" (attempt {job.attempt}), {job.bytes_done} of {job.bytes} bytes copied"
    return why


def _dispatch_later(job_id) -> None:
    dispatch_job.delay(str(job_id))


# The task beside what it runs, so dispatching needs no import of tasks.py (which imports this
# module); its name stays the tasks module's, so messages already queued under it still run.
@task(Queue.DISPATCH, name="controlplane.replication.tasks.dispatch_job")
def dispatch_job(job_id: str) -> str | None:
    job = dispatch(job_id)
    return job.state if job else None


@transaction.atomic
def cancel_job(job: ReplicationJob, who, reason: str = "") -> ReplicationJob:
    """An operator's cancel: the job ends ``cancelled`` (raises IllegalTransition when it has
    already finished) and both agents are told; audited."""
    before = {"state": job.state}
    job = transition(job, JobState.CANCELLED, reason or "cancelled by an operator")
    end(job, JobState.CANCELLED, "")  # tells both agents; already cancelled: no second transition
    record(who, "job.cancelled", job, before=before, after={"state": job.state}, reason=reason)
    return job
