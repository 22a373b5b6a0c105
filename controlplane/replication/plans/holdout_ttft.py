"""The holdout's TTFT estimand on assignments (``HoldoutDraw``): each arm's per-request mean TTFT
(each request weighted alike; assignments as clusters, ``core.stats.ratio_mean``) and the
difference treated minus held out with its Welch-Satterthwaite 95% t interval. The scoreboard's
holdout (``scoreboard.holdout``) and the harm guard's treated-vs-held-out signal (``plans.guard_feed``)
both measure with it."""

from __future__ import annotations

from datetime import datetime

from controlplane.core import stats

from ..models import HoldoutDraw


def arm_mean(units: list[dict]) -> stats.Mean | None:
    """An arm's per-request mean TTFT over its assignments (``ttft_s`` sums, ``ttft_n`` counts);
    None with fewer than two assignments that measured one."""
    return stats.ratio_mean([u["ttft_s"] for u in units], [u["ttft_n"] for u in units])


def closed(policy_id: int, since: datetime, until: datetime) -> list[dict]:
    """The assignments of ``policy_id`` whose windows closed in (since, until]: each counts once,
    whole, when its window closes (``key``, ``held_out``, ``ttft_s``, ``ttft_n``)."""
    rows = HoldoutDraw.objects.filter(
        policy_id=policy_id,
        window_start__isnull=False,
        window_end__gt=since,
        window_end__lte=until,
    ).values_list("workload_key_id", "held_out", "ttft_s", "ttft_n")
    return [{"key": k, "held_out": h, "ttft_s": s, "ttft_n": n} for k, h, s, n in rows]
