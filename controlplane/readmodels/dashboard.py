"""The dashboard's summary: the socket's snapshot and the cache map's first paint (one query set).

A read model joining fleet and replication (so it sits above both, with the cache map).
"""

from __future__ import annotations

import time

from controlplane.accounts.roles import role_of
from controlplane.fleet.models import Engine, Node
from controlplane.replication.models import ReplicationJob, ReplicationPlan
from controlplane.replication.services import LIVE_JOB_STATES, OPEN_PLAN_STATES


def cluster_summary() -> dict:
    """The header figures of the dashboard: the socket's snapshot and the cache map's first paint."""
    return {
        "nodes": {state: Node.objects.filter(state=state).count() for state in ("active", "stale", "retired")},
        "engines": Engine.objects.count(),
        "open_plans": ReplicationPlan.objects.filter(state__in=OPEN_PLAN_STATES).count(),
        "live_job_count": ReplicationJob.objects.filter(state__in=LIVE_JOB_STATES).count(),
    }


def dashboard_snapshot(user) -> dict | None:
    """What a freshly opened dashboard needs before deltas make sense; None if the user has no role.

    Only what the pages read (frontend/static/frontend/cachemap.js: the header counts): GPU memory
    comes with the cache map's own REST call, jobs with the jobs page's table.
    """
    role = role_of(user)
    if role is None:
        return None
    return {
        "type": "snapshot",
        "at": time.time(),
        "user": user.get_username(),
        "role": role,
        **cluster_summary(),
    }
