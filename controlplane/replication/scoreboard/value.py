"""The scoreboard's view of the value model (``plans.value``): modelled against measured per
kind and term, the factors the plan cycle applies, and the holdout's measured saving per request
beside what the model said the treated assignments' items would save per request.

The holdout's figure is the one measure that is not capped at one prefill per copy: every
request of a treated assignment's prefix in its window against a held-out one's (intention to
treat), so its ratio says whether the model's saving shows up at all, queueing effects included.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.core.policy.value import ValueTerms

from ..choices import ItemDecision
from ..models import PlanItem
from ..plans.value import value_model as measured_terms


def value_model(since: datetime, until: datetime, ho: dict) -> dict:
    """``plans.value.value_model`` for the window, with ``holdout`` (None until the holdout
    compares TTFT and its treated arm served requests)."""
    return {**measured_terms(since, until), "holdout": holdout_saving(ho, since, until)}


def holdout_saving(ho: dict, since: datetime, until: datetime) -> dict | None:
    diff, treated = ho.get("ttft_diff_s"), ho.get("treated") or {}
    n = treated.get("requests") or 0
    if not diff or not n:
        return None
    stored = PlanItem.objects.filter(
        decision=ItemDecision.APPROVED,
        holdout_draw__held_out=False,
        holdout_draw__at__gte=since,
        holdout_draw__at__lt=until,
    ).values_list("value_terms", flat=True)
    terms = [t for t in map(ValueTerms.from_dict, stored) if t is not None]
    if not terms:
        return None
    modelled = sum(t.value for t in terms) / n
    measured = -diff["diff"]  # held out minus treated: what a treated request saved
    return {
        "assignments": treated.get("assignments", 0),
        "requests": n,
        "modelled_per_request_s": round(modelled, 4),
        "measured_per_request_s": round(measured, 4),
        "measured_low_s": round(-diff["high"], 4),
        "measured_high_s": round(-diff["low"], 4),
        "ratio": round(measured / modelled, 4) if modelled > 0 else None,
    }
