"""Replicas past their hold: shadow and held-out ones and warm-ups simply end; the others get
an ``evict`` job through their agent (unless a pin keeps them)."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from ..choices import JobAction, JobState, OverrideKind, Transport
from ..models import ReplicationJob, SpeculativeReplica
from ..services import active_overrides
from .delivery import DELIVERY_STATES, dispatch_job
from .states import transition

# No per-prefix evict: vLLM has no API to drop a prefix (a warmed prefix stays ordinary prefix
# cache, evicted LRU when room is needed). An LMCache copy does not end by itself: LMCache 0.5.6
# never frees chunks that arrived by a copy, lease lapsed or not (nodeagent/transfers/lmcache.py),
# so its evict job hands them back to the source they came from, which the job names.
ENDS_BY_ITSELF = (Transport.WARMUP,)
RETURNS_TO_SOURCE = (Transport.LMCACHE,)


def evict_expired() -> int:
    """Replicas past their TTL: shadow and held-out ones (never placed) and warm-ups simply
    end; the others are evicted through their agent."""
    now = timezone.now()
    expired = SpeculativeReplica.objects.filter(evicted_at__isnull=True, expires_at__lte=now)
    # Shadow and held-out replicas were never placed: nothing to evict from the engine.
    ended = expired.filter(Q(shadow=True) | Q(held_out=True)).update(evicted_at=F("expires_at"))
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
                state__in=[JobState.APPROVED, *DELIVERY_STATES],
            ).exists():
                continue  # an eviction is already under way
            transport = r.job.transport if r.job_id else Transport.TCP
            job = ReplicationJob.objects.create(
                item=r.item,  # its workload key gives executors that address KV by tokens the tokens
                action=JobAction.EVICT,
                transport=transport,
                # Only the target's agent runs an evict job; a source is where the chunks go back.
                source=r.job.source if r.job_id and transport in RETURNS_TO_SOURCE else None,
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
    out: dict[int, set[tuple]] = {}
    for o in active_overrides().filter(kind=OverrideKind.PIN):
        out.setdefault(o.engine_id, set()).add(tuple(o.prefix_keys))
    return out
