"""Landed copies count only once the target engine shows them: confirmation, loss, no phantoms.

An executor's success makes a replicate job ``landed`` and records its replica; nothing writes
the copy into the residency index (only agents' reports of the engines' own KV events do), so
the cache map and the residency lookup gateways route by never show a copy the engine did not
confirm. Confirmation comes from the engine side:

- **KV events** (``warmup``, and ``tcp``/``nccl`` in the virtual cluster, whose engines publish
  the blocks they gain): once the residency index holds the whole chain on the target, the copy
  is ``confirmed`` (by ``kv-events``), at the tier the engine reported.
- **LMCache** (``lmcache``): the executor pins the prefix on the target through the controller
  and reports the resident length with its result (``confirmation: {"by": "lmcache-pin",
  "tokens": N, "expected": M}``); N >= M confirms. Each lease renewal reports again as a
  ``job.confirm`` event; a length below M is a loss.
- **Coordinator** (``lmcache-mp``): the directory lists the target for every chunk
  (``lmcache-directory``), reported the same way.

A landed copy not confirmed within ``PREWARM_REPLICA_CONFIRM_SECONDS`` becomes ``unconfirmed``
and its hold ends (a late confirmation still counts); a confirmed copy whose blocks leave the
target before its hold ends becomes ``lost``. ``sweep`` runs with the job sweep.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.core import blockhash
from controlplane.core import protocol as wire
from controlplane.fleet.residency import get_index
from controlplane.realtime import groups
from controlplane.realtime.publish import publish

from ..choices import Confirmation, JobAction, JobState, Transport
from ..models import ReplicationJob, SpeculativeReplica
from .states import EventError, IllegalTransition, transition

log = logging.getLogger(__name__)
HOLDERS_LIMIT = 256
ENGINE_SIDE = {Confirmation.LMCACHE_PIN, Confirmation.LMCACHE_DIRECTORY}


def _chain(job_or_replica) -> list[int]:
    return [blockhash.from_hex(k) for k in job_or_replica.prefix_keys]


def replica_of(job: ReplicationJob) -> SpeculativeReplica | None:
    return SpeculativeReplica.objects.filter(job=job).first()


def _create_replica(job: ReplicationJob) -> SpeculativeReplica:
    item = job.item
    now = timezone.now()
    ttl = item.plan.policy.replica_ttl_seconds if item else 900
    replica, _ = SpeculativeReplica.objects.get_or_create(
        job=job,
        defaults=dict(
            item=item,
            engine_id=job.target_id,
            workload_key=item.workload_key if item else None,
            prefix_keys=job.prefix_keys,
            tier=Transport.LANDS_IN.get(job.transport, job.tier),
            bytes=job.bytes,
            bytes_moved=job.bytes_done,
            shadow=False,
            forecaster=(
                item.plan.summary.get("forecasters", {}).get(str(item.workload_key_id), "")
                if item
                else ""
            ),
            placed_at=now,
            expires_at=now + timedelta(seconds=ttl),
        ),
    )
    return replica


def _publish(job: ReplicationJob, why: str) -> None:
    publish(
        groups.JOBS,
        wire.EVENT_JOB_UPDATE,
        {"job": str(job.pk), "state": job.state, "detail": why[:200]},
    )


def confirm(
    job: ReplicationJob,
    replica: SpeculativeReplica | None,
    by: str,
    detail: str,
    tier: str | None = None,
) -> ReplicationJob:
    """Landed (or unconfirmed) -> confirmed; the replica's hold counts from now on."""
    now = timezone.now()
    job = transition(job, JobState.CONFIRMED, f"confirmed by {by}: {detail}")
    replica = replica or replica_of(job)
    if replica is not None:
        replica.confirmed_at, replica.confirmed_by = now, by
        fields = ["confirmed_at", "confirmed_by"]
        if tier:
            replica.tier = tier
            fields.append("tier")
        if replica.evicted_at and replica.expires_at > now:
            replica.evicted_at = None  # a late confirmation: the copy is held after all
            fields.append("evicted_at")
        replica.save(update_fields=fields)
    _publish(job, detail)
    return job


def _pin_ok(confirmation: dict | None) -> tuple[bool, str, str]:
    """Whether an executor's confirmation shows the whole copy: (ok, by, detail)."""
    if not isinstance(confirmation, dict):
        return False, "", ""
    by = str(confirmation.get("by") or "")
    if by not in ENGINE_SIDE:
        return False, by, f"unknown confirmation source {by!r}"
    try:
        got, want = int(confirmation.get("tokens") or 0), int(confirmation.get("expected") or 0)
    except (TypeError, ValueError):
        return False, by, "confirmation tokens are not integers"
    where = confirmation.get("instance_id") or "the target"
    detail = f"{got} of {want} tokens resident on {where}"
    return want > 0 and got >= want, by, detail


def on_landed(job: ReplicationJob, confirmation: dict | None = None) -> ReplicationJob:
    """Record the landed copy's replica; confirm it now if the engine already shows it."""
    replica = _create_replica(job)
    ok, by, detail = _pin_ok(confirmation)
    if ok:
        return confirm(job, replica, by, detail)
    if by:
        log.info("job %s landed; %s does not confirm it yet (%s)", job.pk, by, detail)
        return job
    holders = get_index().full_holders_many([_chain(job)], limit=HOLDERS_LIMIT)[0]
    mine = next((h for h in holders if h.engine == job.target_id), None)
    if mine is not None:
        return confirm(
            job,
            replica,
            Confirmation.KV_EVENTS,
            "the target's KV events hold the whole prefix",
            tier=mine.tier,
        )
    return job


def on_agent_confirmation(job: ReplicationJob, msg: dict) -> ReplicationJob:
    """A ``job.confirm`` event: an LMCache executor's pin (renewal) or directory reading."""
    ok, by, detail = _pin_ok(msg)
    if not by or by not in ENGINE_SIDE:
        raise EventError(f"job.confirm needs by = one of {sorted(ENGINE_SIDE)}")
    if job.state in (JobState.LANDED, JobState.UNCONFIRMED) and ok:
        return confirm(job, None, by, detail)
    if job.state == JobState.CONFIRMED and not ok:
        return lose(
            job, None, f"{by}: {detail}" + (f" ({msg['error']})" if msg.get("error") else "")
        )
    return job


def lose(job: ReplicationJob, replica: SpeculativeReplica | None, why: str) -> ReplicationJob:
    """Confirmed -> lost: the copy left the engine before its hold ended."""
    now = timezone.now()
    job = transition(job, JobState.LOST, why)
    replica = replica or replica_of(job)
    if replica is not None and replica.lost_at is None:
        replica.lost_at = now
        replica.evicted_at = replica.evicted_at or now
        replica.save(update_fields=["lost_at", "evicted_at"])
    _publish(job, why)
    return job


def sweep(now=None) -> dict:
    """Confirm landed copies the index now shows, mark overdue ones unconfirmed, and confirmed
    KV-event copies that left their engine lost."""
    now = now or timezone.now()
    out = {"confirmed": 0, "unconfirmed": 0, "lost": 0}
    index = get_index()
    # Unconfirmed copies whose hold has not ended yet may still be confirmed late.
    landed = list(
        ReplicationJob.objects.filter(action=JobAction.REPLICATE)
        .filter(
            Q(state=JobState.LANDED) | Q(state=JobState.UNCONFIRMED, replicas__expires_at__gt=now)
        )
        .distinct()
    )
    if landed:
        found = index.full_holders_many([_chain(j) for j in landed], limit=HOLDERS_LIMIT)
        overdue = now - timedelta(seconds=settings.PREWARM_REPLICA_CONFIRM_SECONDS)
        for job, holders in zip(landed, found, strict=True):
            mine = next((h for h in holders if h.engine == job.target_id), None)
            with transaction.atomic():
                try:
                    if mine is not None:
                        confirm(
                            job,
                            None,
                            Confirmation.KV_EVENTS,
                            "the target's KV events hold the whole prefix",
                            tier=mine.tier,
                        )
                        out["confirmed"] += 1
                    elif job.state == JobState.LANDED and job.updated_at <= overdue:
                        _unconfirmed(job, now)
                        out["unconfirmed"] += 1
                except IllegalTransition:
                    continue  # another sweep got there first
    live = list(
        SpeculativeReplica.objects.filter(
            shadow=False,
            confirmed_by=Confirmation.KV_EVENTS,
            lost_at__isnull=True,
            evicted_at__isnull=True,
            expires_at__gt=now,
            engine__residency_synced=True,
            job__state=JobState.CONFIRMED,
        ).select_related("job")
    )
    if live:
        found = index.full_holders_many([_chain(r) for r in live], limit=HOLDERS_LIMIT)
        for replica, holders in zip(live, found, strict=True):
            if any(h.engine == replica.engine_id for h in holders):
                continue
            with transaction.atomic():
                try:
                    lose(
                        replica.job,
                        replica,
                        "the target's KV events no longer hold the whole prefix",
                    )
                    out["lost"] += 1
                except IllegalTransition:
                    continue
    return out


def _unconfirmed(job: ReplicationJob, now) -> None:
    limit = settings.PREWARM_REPLICA_CONFIRM_SECONDS
    why = f"the target engine did not show the copy within {limit:.0f}s of landing"
    transition(job, JobState.UNCONFIRMED, why)
    SpeculativeReplica.objects.filter(job=job, evicted_at__isnull=True).update(evicted_at=now)
    _publish(job, why)
