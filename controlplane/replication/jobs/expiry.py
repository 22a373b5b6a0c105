"""Replicas past their hold: shadow ones and those whose executor cannot evict simply end; the
others get an ``evict`` job through their agent (unless a pin keeps them)."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ..choices import JobAction, JobState, OverrideKind, Transport
from ..models import ReplicationJob, SpeculativeReplica
from ..services import active_overrides
from .delivery import DELIVERY_STATES, dispatch_job
from .states import transition

# No per-prefix evict: vLLM has no API to drop a prefix (a warmed prefix stays ordinary prefix
# cache, evicted LRU when room is needed), and LMCache 0.5.6's controller has none either (its
# /clear empties a whole tier); an LMCache replica ends by its lease lapsing, as the agent stops
# renewing it at the hold's end.
ENDS_BY_ITSELF = (Transport.WARMUP, Transport.LMCACHE)


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
                state__in=[JobState.APPROVED, *DELIVERY_STATES],
            ).exists():
                continue  # an eviction is already under way
            job = ReplicationJob.objects.create(
                item=r.item,  # its workload key gives executors that address KV by tokens the tokens
                action=JobAction.EVICT,
                transport=r.job.transport if r.job_id else Transport.TCP,
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
