"""The fleet doctor's read side: the engines' and nodes' rows as ``controlplane/core/doctor.py``
examines them. The page, the API (``/api/doctor/``), the Prometheus series and ``manage.py
doctor`` all read this one function."""

from __future__ import annotations

import time

from django.conf import settings

from controlplane.core import doctor
from controlplane.fleet.choices import NodeState
from controlplane.fleet.models import Engine
from controlplane.replication.choices import PolicyMode
from controlplane.replication.models import Policy


def limits() -> doctor.Limits:
    return doctor.Limits(
        router_topic=settings.PREWARM_DOCTOR_ROUTER_TOPIC,
        events_silent_s=settings.PREWARM_DOCTOR_EVENTS_SILENT_SECONDS,
        min_requests=settings.PREWARM_DOCTOR_MIN_REQUESTS,
        short_share=settings.PREWARM_DOCTOR_SHORT_SHARE,
        cold_share=settings.PREWARM_DOCTOR_COLD_SHARE,
    )


def findings() -> list[doctor.Finding]:
    """Every finding on the active nodes' engines, now."""
    engines = [
        doctor.EngineView(
            name=f"{e.node.name}/{e.engine_id}",
            model=e.model,
            block_size=e.block_size,
            doctor=e.doctor or {},
            node_transports=tuple(e.node.transports) if e.node.transports is not None else None,
        )
        for e in Engine.objects.select_related("node").filter(node__state=NodeState.ACTIVE)
    ]
    policy = Policy.objects.filter(active=True).only("default_transport", "mode").first()
    # A shadow policy moves nothing: its transport cannot fail a copy.
    transport = policy.default_transport if policy and policy.mode != PolicyMode.SHADOW else ""
    return doctor.examine(engines, time.time(), limits(), transport)


def report() -> dict:
    found = findings()
    return {"healthy": not found, "findings": [f.as_dict() for f in found]}
