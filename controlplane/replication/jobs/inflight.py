"""Copies in flight, as demand's miss reasons ask for them (``warming``).

Demand sits below replication and cannot import it, so replication registers this provider with
``controlplane.demand.misses.register_copies_in_flight`` in its AppConfig.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Q

from wire import blockhash
from wire.protocol import ACTION_REPLICATE, JOB_IN_FLIGHT, JOB_LANDED

from ..models import ReplicationJob

MOVING = (*JOB_IN_FLIGHT, JOB_LANDED)  # approved and not yet shown on the target


def copies_in_flight(targets: set[int], since: float):
    """(target, first block key, started, landed or None) of replicate jobs to ``targets`` in
    flight now, or that stopped moving since ``since`` (unix s; their last change as the end)."""
    after = datetime.fromtimestamp(since, tz=UTC)
    rows = ReplicationJob.objects.filter(
        Q(state__in=MOVING) | Q(updated_at__gte=after),
        action=ACTION_REPLICATE,
        target_id__in=targets,
    ).values_list("target_id", "prefix_keys", "created_at", "updated_at", "state")
    for target, keys, created, updated, state in rows:
        if keys:
            ended = None if state in MOVING else updated.timestamp()
            yield target, blockhash.from_hex(keys[0]), created.timestamp(), ended
