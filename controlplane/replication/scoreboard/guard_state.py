"""The harm guard's state on the scoreboard: how much speculation it allows and why.

The plan cycle keeps the guard's state in each plan's summary (``replication.plans.guard_feed``); the
scoreboard shows the one of the latest plan made before its window's end that carries it (the
plan the gauge ``prewarm_plan_guard_allowed`` reads, where the window ends now).
"""

from __future__ import annotations

from datetime import datetime

from ..models import ReplicationPlan


def guard_state(until: datetime) -> dict | None:
    """``allowed`` (the lowest allowance: 1 is the full budget), the allowances below 1 per
    engine id and per prefix group, ``why``, the items it ``held_back`` in that plan, the
    warm-ups that ``yielded`` to queued requests, the prefixes the plan would have left on fewer
    holders than measured demand alone (``spread``: counts and why), and which plan and
    policy; None before any plan carried a guard."""
    plan = (
        ReplicationPlan.objects.filter(summary__has_key="guard", created_at__lt=until)
        .select_related("policy")
        .order_by("-created_at")
        .first()
    )
    if plan is None:
        return None
    g = plan.summary.get("guard") or {}
    return {
        "allowed": g.get("allowed", 1.0),
        "engines": g.get("engines", {}),
        "groups": g.get("groups", {}),
        "why": g.get("why", ""),
        "held_back": g.get("held_back", 0),
        "yielded": g.get("yielded", {}),
        "spread": g.get("spread", {}),
        "plan": plan.pk,
        "policy": plan.policy.name if plan.policy else None,
        "at": plan.created_at.isoformat(),
    }
