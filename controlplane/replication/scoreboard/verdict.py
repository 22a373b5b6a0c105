"""The scoreboard's verdict: whether speculation earns its cost on this cluster, from evidence.

Firm only from the randomized holdout's interval (``holdout.py``); the cluster's own replica
scores and the simulator's map give a *modelled* verdict, said so, until the holdout has one.
"""

from __future__ import annotations

from django.conf import settings

from .prior import _prior, where_on_the_map

# Below this many scored replicas no verdict is honest (PREWARM_SCOREBOARD_MIN_REPLICAS).
MIN_SCORED_FOR_VERDICT = 20
# Precision under which most replicas are waste, whatever TTFT the few hits saved.
MIN_USEFUL_PRECISION = 0.2
# Placements that took this much longer than the TTFT they saved (and at least this many
# seconds) did harm: the verdict says to turn speculation off.
AVOID_MIN_LINK_S = 1.0


def _own_evidence(best: dict, hits: list[str], cost_s: float) -> str:
    """What the cluster's own scored replicas say: ``pays`` (used, and their counterfactual
    credit exceeds what placing them took), ``waste`` (placing them took far more than they
    saved: mostly unused, or saving little) or ``neutral``."""
    precision = best["precision"] or 0.0
    saved = best["ttft_saved_s"]
    if precision >= MIN_USEFUL_PRECISION and saved > cost_s and hits:
        return "pays"
    if cost_s >= AVOID_MIN_LINK_S and cost_s > 2 * saved:
        return "waste"
    return "neutral"


def _holdout_verdict(ho: dict, prior: str | None, sweep_note: str) -> dict | None:
    """The verdict from the holdout's interval, once ``PREWARM_HOLDOUT_MIN_ASSIGNMENTS``
    assignments on each arm carry TTFT: firm where the interval decides (its worst case pays,
    or its best case does not), else inconclusive with how many more assignments would
    resolve it. None below the minimum."""
    needed = settings.PREWARM_HOLDOUT_MIN_ASSIGNMENTS
    pairs, diff = ho["assignments_compared"], ho["ttft_diff_s"]
    if pairs < needed or diff is None:
        return None
    requests = ho["treated"]["requests"]
    # Uplift per request = held-out TTFT - treated TTFT (positive: treated prefixes were faster).
    up, up_low, up_high = -diff["diff"], -diff["high"], -diff["low"]
    saved, saved_low, saved_high = up * requests, up_low * requests, up_high * requests
    cost = ho["treated_cost_s"]
    figures = (
        f"the randomized holdout ({ho['treated']['assignments']} treated and "
        f"{ho['held_out']['assignments']} held-out assignments, intention to treat; {pairs} a "
        f"side with TTFT, {needed} needed) measures a TTFT saving of {up * 1000:+.0f} ms per "
        f"request on treated prefixes (held out minus treated; 95% t interval "
        f"{up_low * 1000:+.0f} to {up_high * 1000:+.0f} ms), "
        f"{saved:.1f}s over their {requests} requests, for {cost:.1f}s spent placing them "
        "(failed copies included)"
    )
    base = {"prior": prior, "holdout_assignments": pairs, "basis": "holdout"}
    if saved_low > cost:
        return {
            **base,
            "verdict": "speculation_pays",
            "firm": True,
            "tenants_that_benefit": [
                t["tenant"]
                for t in ho["by_tenant"]
                if t["ttft_diff_s"] and t["ttft_diff_s"]["high"] < 0
            ],
            "text": f"Speculation pays: {figures} ({sweep_note}).",
        }
    if saved_high < cost:
        avoid = cost >= AVOID_MIN_LINK_S and cost > 2 * max(0.0, saved_high)
        return {
            **base,
            "verdict": "avoid" if avoid else "reactive_enough",
            "firm": True,
            "tenants_that_benefit": [],
            "text": (
                f"Avoid speculation here: {figures}; placing replicas costs more than even "
                f"the interval's best case saves ({sweep_note})."
                if avoid
                else f"Reactive replication is enough: {figures}; even the interval's best "
                f"case does not pay for placing them ({sweep_note})."
            ),
        }
    more = ho.get("more_assignments_needed")
    resolve = (
        f"about {more} more assignments a side would resolve a difference this size (80% power)"
        if more is not None
        else "the interval's width, not more of the same, decides it"
    )
    return {
        **base,
        "verdict": "insufficient_data",
        "firm": False,
        "tenants_that_benefit": [],
        "text": f"Not yet decided: {figures}; the interval spans both paying and not paying, "
        f"and {resolve} ({sweep_note}).",
    }


def recommendation(live: dict, shadow: dict, by_tenant: list[dict], ho: dict | None = None) -> dict:
    """A plain verdict on whether speculation earns its cost here, from evidence.

    1. The randomized holdout, once ``PREWARM_HOLDOUT_MIN_ASSIGNMENTS`` assignments a side
       carry TTFT: the measured per-request uplift's 95% t interval times the treated requests
       against what placing the treated arm's replicas cost (``basis = "holdout"``; ``firm``
       where the interval decides).
    2. Otherwise a *modelled* verdict (``firm`` False, ``basis`` "modelled ..."): the cluster's
       live scored replicas (shadow ones only where no live replica was scored, their hits
       estimated as the key's requests over its holders), each credited at most one prefill,
       against placement cost. Fewer than ``PREWARM_SCOREBOARD_MIN_REPLICAS`` scored:
       ``insufficient_data``.
    3. The simulator's map is a prior only where this cluster can be placed on it
       (``where_on_the_map``). Its ``reactive-enough`` counts only where its interval rules out
       a material gain (``MATERIAL_GAIN``); elsewhere ``"uncertain"``.

    Returns ``{"verdict", "basis", "firm", "prior", "tenants_that_benefit",
    "holdout_assignments", "text"}``.
    """
    sweep_note, tip = where_on_the_map()
    prior = _prior(tip)
    ho = ho or {"assignments_compared": 0, "ttft_diff_s": None}
    measured = _holdout_verdict(ho, prior, sweep_note)
    if measured is not None:
        return measured
    pairs = ho["assignments_compared"]
    pairs_note = (
        f"; the holdout has {pairs} of the {settings.PREWARM_HOLDOUT_MIN_ASSIGNMENTS} "
        "assignments a side with TTFT its measured verdict needs"
    )
    scored = live["scored"] + shadow["scored"]
    needed = getattr(settings, "PREWARM_SCOREBOARD_MIN_REPLICAS", MIN_SCORED_FOR_VERDICT)
    base = {"prior": prior, "holdout_assignments": pairs, "firm": False}
    if scored < needed:
        return _too_few_scored(base, scored, needed, pairs_note, sweep_note)
    return _modelled_verdict(live, shadow, by_tenant, base, pairs_note, sweep_note)


def _too_few_scored(base: dict, scored: int, needed: int, pairs_note: str, sweep_note: str) -> dict:
    """``insufficient_data``: too few replicas scored for this cluster's own verdict; the map's
    prior, if any, stands in meanwhile."""
    prior = base["prior"]
    text = (
        f"Only {scored} speculative replicas have been scored (live and shadow); at least "
        f"{needed} are needed before this cluster's own verdict means anything{pairs_note}. "
        f"Keep the policy in shadow mode and look again later ({sweep_note})"
    )
    if prior is not None:
        text += (
            f". Until then the prior is the simulator's map: "
            f"'{prior.replace('_', ' ')}' at this cluster's placement time and load"
        )
        if prior == "uncertain":
            text += " (its seeds neither show a gain nor rule one out)"
    return {
        **base,
        "verdict": "insufficient_data",
        "basis": "map" if prior else "none",
        "tenants_that_benefit": [],
        "text": text + ".",
    }


def _modelled_verdict(
    live: dict, shadow: dict, by_tenant: list[dict], base: dict, pairs_note: str, sweep_note: str
) -> dict:
    """The cluster's own scores (live replicas, else shadow ones) against placement cost, read
    with the map's prior."""
    prior = base["prior"]
    hits = [
        t["tenant"]
        for t in by_tenant
        if t["precision"] is not None
        and t["precision"] >= MIN_USEFUL_PRECISION
        and t["ttft_saved_s"] > t["cost_s"]
    ]
    best, which = (live, "live") if live["scored"] else (shadow, "shadow (hits estimated)")
    cost_s = best["cost_s"]
    own = _own_evidence(best, hits, cost_s)
    scores = (
        f"Modelled, not measured: {best['precision']:.0%} of {best['scored']} scored {which} "
        f"replicas were used, credited {best['ttft_saved_s']:.1f}s of time to first token (at "
        f"most one prefill each, {best['saving_basis']}) for {cost_s:.1f}s spent placing "
        f"them{pairs_note}"
    )
    with_map = "modelled (own scores and map)"
    if own == "waste":
        return {
            **base,
            "verdict": "avoid",
            "basis": "modelled (own scores)",
            "tenants_that_benefit": [],
            "text": f"{scores}: speculation costs more than it saves here. Turn it off (or "
            f"keep it in shadow mode) and rely on reactive replication ({sweep_note}).",
        }
    if own == "pays" and prior == "reactive_enough":
        return {
            **base,
            "verdict": "reactive_enough",
            "basis": with_map,
            "tenants_that_benefit": [],
            "text": f"{scores}, but placements are fast next to a burst's onset here, so a "
            f"reactive copy made after demand turns hot would have served nearly as well: "
            f"{sweep_note}. Reactive replication is enough on this cluster; keep "
            "speculation off or in shadow mode.",
        }
    if own == "pays":
        return {
            **base,
            "verdict": "speculation_pays",
            "basis": with_map if prior == "speculation_pays" else "modelled (own scores)",
            "tenants_that_benefit": hits,
            "text": f"{scores}. Speculation looks like it pays for {', '.join(hits[:8])}; the "
            f"holdout will say whether it does ({sweep_note}).",
        }
    if prior == "avoid":
        return {
            **base,
            "verdict": "avoid",
            "basis": with_map,
            "tenants_that_benefit": [],
            "text": f"{scores}, and the simulator's map says speculation hurts at this "
            f"cluster's placement time and load: {sweep_note}. Turn it off.",
        }
    return {
        **base,
        "verdict": "reactive_enough",
        "basis": "modelled (own scores)" if prior is None else with_map,
        "tenants_that_benefit": hits,
        "text": f"{scores}: speculation does not earn its cost here. Reactive replication is "
        f"enough on this cluster ({sweep_note}).",
    }
