"""The value model against what the control plane measured (``core.policy.value``).

Each confirmed live copy of an item that stored its terms (``PlanItem.value_terms``, the model
uncorrected) has an outcome once scored (``scoring.py``) and once the horizon its value was
modelled over has passed: its hits (requests its engine served with the placed tokens cached)
and the TTFT credited to it (at most one prefill of those tokens, from measured TTFT where
records carry it). Copies never confirmed are the transfer's failure, not the model's: left out.
The plan cycle corrects the model by the outcomes of the last ``LOOKBACK`` (``calibration``);
the scoreboard shows the ratios of its window beside the factors in use (``value_model``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from controlplane.core.policy import value
from controlplane.core.policy.value import Calibration, Outcome, ValueTerms

from ..models import Policy, SpeculativeReplica

LOOKBACK = timedelta(days=2)


def outcomes(since: datetime, until: datetime) -> list[Outcome]:
    """Outcomes of the confirmed live copies placed in [since, until) whose modelled horizon
    ended by ``until``."""
    rows = SpeculativeReplica.objects.filter(
        shadow=False,
        held_out=False,
        confirmed_at__isnull=False,
        scored_at__isnull=False,
        item__isnull=False,
        placed_at__gte=since,
        placed_at__lt=until,
    ).values_list("placed_at", "hits", "ttft_saved_s", "item__value_terms", "item__plan__policy")
    horizons = _horizons({r[4] for r in rows})
    out = []
    for placed, hits, saved, stored, policy in rows:
        terms = ValueTerms.from_dict(stored or {})
        if terms is None or placed + horizons.get(policy, timedelta(0)) > until:
            continue  # an item from before the terms were stored, or its horizon is still open
        out.append(Outcome(terms, hits, saved))
    return out


def _horizons(policy_ids: set) -> dict:
    return {
        pk: timedelta(seconds=h)
        for pk, h in Policy.objects.filter(pk__in=policy_ids).values_list("pk", "horizon_s")
    }


def calibration(now: datetime) -> Calibration:
    """The correction the outcomes of the last ``LOOKBACK`` call for."""
    return value.calibrate(value.tally(outcomes(now - LOOKBACK, now)))


def value_model(since: datetime, until: datetime) -> dict:
    """Modelled against measured per kind and term over the window's copies, with the
    factors the plan cycle applies as of ``until`` (``core.policy.value.rows``)."""
    done = outcomes(since, until)
    modelled = sum(o.terms.value for o in done)
    measured = sum(o.saved_s for o in done)
    return {
        "copies": len(done),
        "modelled_s": round(modelled, 3),
        "measured_s": round(measured, 3),
        "ratio": round(measured / modelled, 4) if modelled > 0 else None,
        "lookback_s": LOOKBACK.total_seconds(),
        "terms": value.rows(value.tally(done), calibration(until)),
    }
