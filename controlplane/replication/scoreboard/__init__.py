"""The scoreboard: what speculative replicas bought and what they cost, per policy, forecaster, tenant.

The shape is the one `GET /api/scoreboard/` returns, so the dashboard and the API share it:
``{"window", "totals", "shadow_totals", "by_policy", "by_forecaster", "by_tenant", "holdout",
"items", "recommendation", "guard", "value_model"}`` with each metric block M = ``{"replicas", "hits", "hits_basis",
"hits_measured_replicas", "precision", "bytes_moved", "vram_byte_seconds", "host_byte_seconds",
"ttft_saved_s", "saving_basis", "cost_s"}``: ``ttft_saved_s`` is counterfactual credit (at most
one prefill of the placed tokens per used replica, ``saving_basis`` says from what) and
``cost_s`` what placing them took (warm-up prefill, copy link time). ``holdout`` compares the
assignments drawn treated with those drawn held out, intention to treat, each measured on its
prefix's requests in one window rule for both arms, with a per-request TTFT difference and its
95% t interval (``holdout.py``); ``items`` puts each approved plan item's modelled saving beside
what the scoreboard can credit it (one prefill) and what it was credited (``aggregation.py``);
``recommendation`` is the verdict (``verdict.py``), with the map's prior (``prior.py``);
``guard`` is how much speculation the harm guard allows as of the window's end and why, from the
latest plan's summary (``guard_state.py``; None before any plan carried one); ``value_model`` is the
planner's value model against what its copies measured, per kind and term, with the correction
the plan cycle applies and the holdout's saving per request beside the model's (``value.py``).
Precision is the share of *scored* replicas that were hit at least once (None until one is
scored). ``hits_basis`` says where the hits come from: ``measured`` (every scored replica's hits
are requests its engine served with the prefix cached, from gateways' records), ``estimated``
(none: records name no serving engine, or shadow replicas) or ``mixed``. Bytes moved are what
executors reported; VRAM held counts GPU-tier replicas only, host memory is apart.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from ..models import SpeculativeReplica
from .aggregation import _AGG, _grouped, _metrics, _public, items
from .guard_state import guard_state
from .holdout import holdout, randomization
from .prior import where_on_the_map
from .value import value_model
from .verdict import recommendation

__all__ = ["recommendation", "scoreboard", "where_on_the_map"]


def scoreboard(since: datetime | None = None, until: datetime | None = None) -> dict:
    """Scores of replicas placed in [since, until) (default: the last 7 days), and the holdout
    over the assignments drawn in it."""
    until = until or timezone.now()
    since = since or until - timedelta(days=7)
    window = SpeculativeReplica.objects.filter(placed_at__gte=since, placed_at__lt=until)
    placed = window.filter(held_out=False)
    live_qs, shadow_qs = placed.filter(shadow=False), placed.filter(shadow=True)
    live, shadow = _metrics(live_qs.aggregate(**_AGG)), _metrics(shadow_qs.aggregate(**_AGG))
    by_tenant = _grouped(placed, "workload_key__tenant", "tenant")
    ho = holdout(since, until)
    ho["randomization"] = randomization(since, until)
    return {
        "window": {"since": since.isoformat(), "until": until.isoformat()},
        "totals": _public(live),
        "shadow_totals": _public(shadow),
        "by_policy": _grouped(placed, "item__plan__policy__name", "policy", "item__plan__mode"),
        "by_forecaster": _grouped(placed, "forecaster", "forecaster"),
        "by_tenant": by_tenant,
        "holdout": ho,
        "items": items(since, until),
        "recommendation": recommendation(live, shadow, by_tenant, ho),
        "guard": guard_state(until),
        "value_model": value_model(since, until, ho),
    }
