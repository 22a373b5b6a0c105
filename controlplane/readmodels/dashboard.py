"""The dashboard's summary: the socket's snapshot and the cache map's first paint (one query set).

A read model joining fleet and replication (so it sits above both, with the cache map).
"""

from __future__ import annotations

from controlplane.accounts.roles import role_of
from controlplane.core import protocol as wire
from controlplane.fleet.choices import NodeState
from controlplane.fleet.models import Engine, Node
from controlplane.replication.models import ReplicationJob, ReplicationPlan
from controlplane.replication.services import OPEN_PLAN_STATES


def cluster_summary() -> dict:
    """The header figures of the dashboard: the socket's snapshot and the cache map's first paint
    (frontend/templates/frontend/cachemap.html, frontend/static/frontend/cachemap.js)."""
    return {
        "nodes": {
            state: Node.objects.filter(state=state).count()
            for state in (NodeState.ACTIVE, NodeState.STALE)
        },
        "engines": Engine.objects.count(),
        "open_plans": ReplicationPlan.objects.filter(state__in=OPEN_PLAN_STATES).count(),
        "live_job_count": ReplicationJob.objects.filter(state__in=wire.JOB_LIVE).count(),
    }


def dashboard_snapshot(user) -> dict | None:
    """What a freshly opened dashboard needs before deltas make sense; None if the user has no role.

    Only what the pages read (frontend/static/frontend/cachemap.js: the header counts): GPU memory
    comes with the cache map's own REST call, jobs with the jobs page's table, the user and role
    with the page itself.
    """
    if role_of(user) is None:
        return None
    return {"type": "snapshot", **cluster_summary()}
