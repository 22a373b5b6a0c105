"""The randomized holdout as an experiment: intention to treat, one window rule for both arms, a
per-request estimand with its t interval, and how many more assignments would resolve it.

- **Unit**: the assignment (``HoldoutDraw``): a prefix's random draw when an item of it was
  approved (``plans/holdout.py``, permuted blocks).
- **Arms, intention to treat**: every assignment drawn treated is in the treated arm whatever
  became of its copies (landed, failed, timed out, redundant, unconfirmed), and what they cost
  counts; every assignment drawn held out is in the control arm. ``per_protocol`` (treated =
  assignments with a copy confirmed) is shown beside, labelled, never used by the verdict.
- **Windows**: each assignment measures every request of its prefix, whatever engine served it,
  in one window that opens at the decision plus the item's modelled placement time and lasts
  the policy's replica TTL (``plans.holdout.window``), on both arms alike.
- **Estimand**: the per-request mean TTFT of each arm (each request weighted alike; its
  standard error treats assignments as clusters, ``core.stats.ratio_mean``), the difference
  treated minus held out with its Welch-Satterthwaite t interval. The mean of per-assignment
  means is beside it, labelled.
"""

from __future__ import annotations

import math
from datetime import datetime

from django.db.models import Count, Q

from controlplane.core import stats

from ..choices import ItemDecision
from ..models import HoldoutDraw, PlanItem, SpeculativeReplica
from ..plans import holdout_ttft

ESTIMAND = (
    "per-request mean TTFT, treated minus held out (every request of the prefix in its "
    "assignment's window, any engine; requests weighted alike, assignments as clusters)"
)
SAMPLES = 3000  # per arm, for the page's distributions


def _costs(draw_ids: list[int]) -> tuple[dict[int, float], dict[int, bool]]:
    """What each treated assignment's approved items cost (a scored replica's placement cost,
    else the item's modelled placement time: a copy that failed or ended redundant took its
    link or prefill all the same) and whether any of its copies was confirmed."""
    cost: dict[int, float] = {}
    confirmed: dict[int, bool] = {}
    approved = PlanItem.objects.filter(
        holdout_draw_id__in=draw_ids, decision=ItemDecision.APPROVED
    ).values_list("pk", "holdout_draw_id", "cost_s")
    items = {pk: (draw, modelled) for pk, draw, modelled in approved}
    placed: dict[int, tuple[float, bool]] = {}
    for item, scored, cost_s, conf in SpeculativeReplica.objects.filter(
        item_id__in=list(items), shadow=False, held_out=False
    ).values_list("item_id", "scored_at", "cost_s", "confirmed_at"):
        placed[item] = (cost_s if scored is not None else items[item][1], conf is not None)
    for pk, (draw, modelled) in items.items():
        c, conf = placed.get(pk, (modelled, False))
        cost[draw] = cost.get(draw, 0.0) + c
        confirmed[draw] = confirmed.get(draw, False) or conf
    return cost, confirmed


def _interval(ci: stats.Interval | None) -> dict | None:
    if ci is None:
        return None
    return {"diff": ci.estimate, "low": ci.low, "high": ci.high, "se": ci.se, "df": ci.df}


def _arm(units: list[dict]) -> dict:
    n = sum(u["requests"] for u in units)
    with_ttft = [u for u in units if u["ttft_n"]]
    ttft_n = sum(u["ttft_n"] for u in with_ttft)
    return {
        "assignments": len(units),
        "prefixes": len({u["key"] for u in units}),
        "assignments_with_requests": sum(1 for u in units if u["requests"]),
        "assignments_with_ttft": len(with_ttft),
        "requests": n,
        "hit_rate": sum(u["hits"] for u in units) / n if n else None,
        "cached_tokens_per_request": sum(u["cached"] for u in units) / n if n else None,
        "ttft_mean_s": sum(u["ttft_s"] for u in with_ttft) / ttft_n if ttft_n else None,
        "cost_s": sum(u["cost_s"] for u in units),
    }


def _more_needed(t: stats.Mean | None, h: stats.Mean | None, ci: stats.Interval | None):
    """Assignments a side an interval would need to exclude zero with 80% power if the true
    difference were the one measured (None where it already does, or cannot be said)."""
    if t is None or h is None or ci is None or ci.excludes_zero():
        return None
    need = stats.required_n(ci.estimate, t.se * math.sqrt(t.n), h.se * math.sqrt(h.n))
    return None if need is None else max(0, need - min(t.n, h.n))


def compare(treated: list[dict], held: list[dict], samples: bool = False) -> dict:
    """Treated vs held-out assignments: each arm's pooled figures, the per-request TTFT and hit
    rate differences (treated minus held out) with their 95% t intervals, the per-assignment
    mean difference (labelled), and how many more assignments would resolve the TTFT one."""
    t_ttft, h_ttft = holdout_ttft.arm_mean(treated), holdout_ttft.arm_mean(held)
    ci = stats.difference(t_ttft, h_ttft)
    hit = stats.difference(
        stats.ratio_mean([u["hits"] for u in treated], [u["requests"] for u in treated]),
        stats.ratio_mean([u["hits"] for u in held], [u["requests"] for u in held]),
    )
    per_assignment = stats.welch(
        [u["ttft_s"] / u["ttft_n"] for u in treated if u["ttft_n"]],
        [u["ttft_s"] / u["ttft_n"] for u in held if u["ttft_n"]],
    )
    t, h = _arm(treated), _arm(held)
    out = {
        "unit": "assignment",
        "analysis": "intention to treat",
        "estimand": ESTIMAND,
        "treated": t,
        "held_out": h,
        "ttft_diff_s": _interval(ci),
        "hit_rate_diff": _interval(hit),
        "ttft_diff_per_assignment_s": _interval(per_assignment),
        "assignments_compared": min(t["assignments_with_ttft"], h["assignments_with_ttft"]),
        "more_assignments_needed": _more_needed(t_ttft, h_ttft, ci),
        "treated_cost_s": t["cost_s"],
    }
    if samples:
        out["ttft_samples"] = {
            "treated": [x for u in treated for x in u["samples"]][:SAMPLES],
            "held_out": [x for u in held for x in u["samples"]][:SAMPLES],
        }
    return out


def _units(since: datetime, until: datetime) -> list[dict]:
    draws = HoldoutDraw.objects.filter(at__gte=since, at__lt=until, window_start__isnull=False)
    rows = list(
        draws.values(
            "pk",
            "held_out",
            "workload_key_id",
            "workload_key__tenant",
            "policy__name",
            "requests",
            "hits",
            "cached_tokens",
            "ttft_s",
            "ttft_n",
            "ttft_samples",
        ).order_by("pk")
    )
    cost, confirmed = _costs([r["pk"] for r in rows if not r["held_out"]])
    return [
        {
            "held_out": r["held_out"],
            "key": r["workload_key_id"],
            "tenant": r["workload_key__tenant"] or "(none)",
            "policy": r["policy__name"] or "(none)",
            "requests": r["requests"],
            "hits": r["hits"],
            "cached": r["cached_tokens"],
            "ttft_s": r["ttft_s"],
            "ttft_n": r["ttft_n"],
            "samples": r["ttft_samples"] or [],
            "cost_s": cost.get(r["pk"], 0.0),
            "copy_confirmed": confirmed.get(r["pk"], False),
        }
        for r in rows
    ]


def holdout(since: datetime, until: datetime) -> dict:
    """The holdout over the assignments drawn in [since, until): intention to treat overall
    (with the TTFT samples the page plots), per policy and per tenant, and the per-protocol
    comparison beside it, labelled."""
    units = _units(since, until)
    treated = [u for u in units if not u["held_out"]]
    held = [u for u in units if u["held_out"]]
    out = compare(treated, held, samples=True)
    pp = compare([u for u in treated if u["copy_confirmed"]], held)
    out["per_protocol"] = {
        "label": "per protocol: treated = assignments with a copy confirmed (not the verdict's)",
        "treated_assignments": pp["treated"]["assignments"],
        "ttft_diff_s": pp["ttft_diff_s"],
    }
    for name in ("policy", "tenant"):
        groups = sorted({u[name] for u in units})
        out[f"by_{name}"] = [
            {
                name: g,
                **compare([u for u in treated if u[name] == g], [u for u in held if u[name] == g]),
            }
            for g in groups
        ]
    return out


def randomization(since: datetime, until: datetime) -> list[dict]:
    """How the holdout's arms were drawn in the window, per policy and block shape
    (``plans/holdout.py``: permuted blocks): the draws and how many held out."""
    rows = (
        HoldoutDraw.objects.filter(at__gte=since, at__lt=until)
        .values("policy__name", "block_size", "block_held")
        .annotate(draws=Count("id"), held_out=Count("id", filter=Q(held_out=True)))
        .order_by("policy__name", "block_size")
    )
    return [
        {
            "policy": r["policy__name"],
            "block_size": r["block_size"],
            "held_per_block": r["block_held"],
            "draws": r["draws"],
            "held_out": r["held_out"],
        }
        for r in rows
    ]
