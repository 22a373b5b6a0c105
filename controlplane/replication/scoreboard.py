"""The scoreboard: what speculative replicas bought and what they cost, per policy, forecaster, tenant.

The shape is the one `GET /api/scoreboard/` returns, so the dashboard and the API share it:
``{"window", "totals", "shadow_totals", "by_policy", "by_forecaster", "by_tenant", "holdout",
"recommendation"}`` with each metric block M = ``{"replicas", "hits", "hits_basis",
"hits_measured_replicas", "precision", "bytes_moved", "vram_byte_seconds", "host_byte_seconds",
"ttft_saved_s", "saving_basis", "cost_s"}``: ``ttft_saved_s`` is counterfactual credit (at most
one prefill of the placed tokens per used replica, ``saving_basis`` says from what) and
``cost_s`` what placing them took (warm-up prefill, copy link time). ``holdout`` compares the
treated assignments with the held-out ones (the randomized control arm: a prefix's draw, kept
while it has live records), each measured on the prefix's requests during its records' holds,
whatever engine served them, overall, per policy and per tenant, each difference with its 95%
interval.
Precision is the share of *scored* replicas that were hit at least once (None until one is
scored). ``hits_basis`` says where the hits come from: ``measured`` (every scored replica's hits
are requests its engine served with the prefix cached, from gateways' records), ``estimated``
(none: records name no serving engine, or shadow replicas) or ``mixed``. Bytes moved are what
executors reported; VRAM held counts GPU-tier replicas only, host memory is apart.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.utils import timezone

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.models import Engine
from controlplane.sim.speculation_map import advice, load_map

from .choices import Transport
from .models import HoldoutDraw, Policy, SpeculativeReplica
from .plans.costs import cost_model_for, placement_cost
from .scoring import MEASURED

# Below this many scored replicas no verdict is honest (PREWARM_SCOREBOARD_MIN_REPLICAS).
MIN_SCORED_FOR_VERDICT = 20
# Precision under which most replicas are waste, whatever TTFT the few hits saved.
MIN_USEFUL_PRECISION = 0.2

_AGG = {
    "replicas": Count("id"),
    "scored": Count("id", filter=Q(scored_at__isnull=False)),
    "scored_hit": Count("id", filter=Q(scored_at__isnull=False, hits__gt=0)),
    # Filters on hits before the "hits" alias below shadows the field.
    "measured_saving": Count(
        "id", filter=Q(scored_at__isnull=False, hits__gt=0, saving_basis=MEASURED)
    ),
    "used": Count("id", filter=Q(scored_at__isnull=False, hits__gt=0)),
    "hits": Sum("hits"),
    "measured": Count("id", filter=Q(scored_at__isnull=False, hits_measured=True)),
    "bytes_moved": Sum("bytes_moved"),
    "nominal_bytes": Sum("bytes"),
    "vram_byte_seconds": Sum("vram_byte_seconds"),
    "host_byte_seconds": Sum("host_byte_seconds"),
    "ttft_saved_s": Sum("ttft_saved_s"),
    "cost_s": Sum("cost_s"),
}


def hits_basis(scored: int, measured: int) -> str:
    """measured | estimated | mixed: whether hits come from served-request records."""
    if scored and measured >= scored:
        return "measured"
    return "mixed" if measured else "estimated"


def _metrics(row: dict) -> dict:
    scored = row.get("scored") or 0
    measured = row.get("measured") or 0
    return {
        "replicas": row.get("replicas") or 0,
        "hits": row.get("hits") or 0,
        "hits_basis": hits_basis(scored, measured),
        "hits_measured_replicas": measured,
        "precision": (row.get("scored_hit") or 0) / scored if scored else None,
        "bytes_moved": row.get("bytes_moved") or 0,
        "vram_byte_seconds": float(row.get("vram_byte_seconds") or 0.0),
        "host_byte_seconds": float(row.get("host_byte_seconds") or 0.0),
        "ttft_saved_s": float(row.get("ttft_saved_s") or 0.0),
        "saving_basis": hits_basis(row.get("used") or 0, row.get("measured_saving") or 0)
        .replace("measured", "measured TTFT")
        .replace("estimated", "cost model"),
        "cost_s": float(row.get("cost_s") or 0.0),
        "scored": scored,
        "nominal_bytes": row.get("nominal_bytes") or 0,
    }


_PRIVATE = ("scored", "nominal_bytes")


def _public(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in _PRIVATE}


def _grouped(qs, field: str, name: str, extra: str | None = None) -> list[dict]:
    fields = [field] + ([extra] if extra else [])
    out = []
    for row in qs.values(*fields).annotate(**_AGG).order_by(field):
        entry = {name: row[field] if row[field] not in (None, "") else "(none)"}
        if extra:
            entry["mode"] = row[extra]
        out.append({**entry, **_public(_metrics(row))})
    return out


def _placement_s(policy: Policy | None, tokens: float, per_token: float, model: str) -> float:
    """What one placement takes on this cluster: a warm-up the target's prefill of the prefix,
    a copy its bytes over the link left by serving traffic (the map's copy-time axis)."""
    transport = policy.default_transport if policy else Transport.TCP
    cm = cost_model_for(model)
    seconds, _ = placement_cost(transport, int(tokens * per_token), cm, int(tokens))
    return seconds


def where_on_the_map() -> tuple[str, dict | None]:
    """This cluster's place on the simulator's map of where speculation pays.

    Placement time = a warm-up's prefill of the workload keys' mean shared prefix on the target
    (the cost model), or a copy's bytes over the link speed left by serving traffic (link x
    (1 - load)); load = mean KV usage the engines report. The map was measured on simulated GPU
    clusters over a grid of placement time / burst onset and load, so a cluster whose engines
    report no GPU (vLLM's CPU build), or that falls outside the grid, cannot be placed on it.
    Returns a sentence and the map's advice (None when the cluster cannot be placed).
    """
    engines = list(Engine.objects.values("pk", "block_size", "bytes_per_block", "metrics", "model"))
    tokens = [
        t
        for t in WorkloadKey.objects.filter(prefix_tokens__gt=0).values_list(
            "prefix_tokens", flat=True
        )[:5000]
    ]
    per_token = [
        e["bytes_per_block"] / e["block_size"]
        for e in engines
        if e["bytes_per_block"] and e["block_size"]
    ]
    if not tokens or not per_token:
        return (
            "no prefixes or engines reported yet to place this cluster on the simulator's map",
            None,
        )
    if not Engine.objects.filter(gpus__isnull=False).exists():
        return (
            "this cluster cannot be placed on the simulator's map: its engines report no GPU "
            "(the map was measured on GPU clusters), so only its own evidence counts",
            None,
        )
    loads = [
        float(e["metrics"].get("kv_usage"))
        for e in engines
        if isinstance((e["metrics"] or {}).get("kv_usage"), int | float)
    ]
    load = sum(loads) / len(loads) if loads else settings.PREWARM_DEFAULT_ENGINE_LOAD
    load = min(max(load, 0.0), 0.95)
    policy = Policy.objects.filter(active=True).first()
    mean_tokens = sum(tokens) / len(tokens)
    place_s = _placement_s(
        policy, mean_tokens, sum(per_token) / len(per_token), engines[0]["model"] or ""
    )
    if not policy or policy.default_transport != Transport.WARMUP:
        place_s = place_s / max(0.05, 1 - load)
    try:
        doc = load_map()
        ratio = place_s / doc["burst_onset_s"]
        ratios = [c["copy_to_onset"] for c in doc["cells"]]
        loads_grid = [c["load"] for c in doc["cells"]]
        if not (
            min(ratios) / GRID_SLACK <= ratio <= max(ratios) * GRID_SLACK
            and min(loads_grid) - LOAD_SLACK <= load <= max(loads_grid) + LOAD_SLACK
        ):
            return (
                f"this cluster cannot be placed on the simulator's map: placements take "
                f"~{place_s:.3f}s ({ratio:.4f} of a {doc['burst_onset_s']:.0f}s burst onset) at "
                f"load {load:.2f}, outside the map's grid ({min(ratios):.4f}-{max(ratios):.2f}, "
                f"load {min(loads_grid):.1f}-{max(loads_grid):.1f})",
                None,
            )
        tip = advice(ratio, load, doc)
    except ValueError as exc:
        return f"the simulator's map is unavailable ({exc})", None
    where = (
        f"placements here take ~{place_s:.2f}s ({place_s / doc['burst_onset_s']:.3f} of a "
        f"{doc['burst_onset_s']:.0f}s burst onset) at load {load:.2f}; the simulator's map says "
        f"'{tip['verdict']}' there (predictive vs reactive p99 {tip['expected_gain_p99']:+.1%}, "
        f"seed noise {tip['noise_p99']:.1%})"
    )
    return where, tip


# The map's grid, widened by this factor in placement time and this much in load, is where a
# cluster can be placed on it; beyond, its nearest cell is an extrapolation.
GRID_SLACK = 3.0
LOAD_SLACK = 0.15
# Placements that took this much longer than the TTFT they saved (and at least this many
# seconds) did harm: the verdict says to turn speculation off.
AVOID_MIN_LINK_S = 1.0
_PRIOR = {"speculate": "speculation_pays", "reactive-enough": "reactive_enough", "avoid": "avoid"}
# A map cell says "reactive is enough" with authority only where its interval rules out a gain
# this large (predictive's p99 gain + its seed noise below it); a wider cell is no evidence
# either way, and the cluster's own scores decide.
MATERIAL_GAIN = 0.05
Z95 = 1.96


def _prior(tip: dict | None) -> str | None:
    if not tip:
        return None
    prior = _PRIOR.get(tip["verdict"])
    if prior == "reactive_enough" and tip["expected_gain_p99"] + tip["noise_p99"] >= MATERIAL_GAIN:
        return "uncertain"
    return prior


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


# -- the holdout -------------------------------------------------------------------------------
def _mean_ci(a: list[float], b: list[float]) -> dict | None:
    """mean(a) - mean(b) with a 95% interval (Welch, normal approximation); None below 2 each."""
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    half = Z95 * math.sqrt(va / len(a) + vb / len(b))
    diff = ma - mb
    return {"diff": diff, "low": diff - half, "high": diff + half}


_KEY_FIELDS = (
    "item__holdout_draw_id",
    "workload_key_id",
    "key_requests",
    "key_hits",
    "key_cached_tokens",
    "key_ttft_s",
    "key_ttft_n",
    "key_ttft_samples",
    "cost_s",
)


def _by_assignment(rows: list[dict]) -> list[dict]:
    """One arm's records summed per assignment, the holdout's unit: a prefix's draw
    (``HoldoutDraw``), which holds while the prefix has live records; a prefix drawn again after
    its holds ended is a new unit (a new random draw over a later window). Records decided
    without a draw (holdout off) are grouped per prefix. Each of a prefix's requests counts for
    one of its records."""
    out: dict = {}
    for r in rows:
        draw = r["item__holdout_draw_id"]
        u = out.setdefault(
            ("draw", draw) if draw is not None else ("prefix", r["workload_key_id"]),
            {"records": 0, "n": 0, "hits": 0, "cached": 0, "ttft_s": 0.0, "ttft_n": 0,
             "samples": [], "cost_s": 0.0, "key": r["workload_key_id"]},
        )  # fmt: skip
        u["records"] += 1
        u["n"] += r["key_requests"]
        u["hits"] += r["key_hits"]
        u["cached"] += r["key_cached_tokens"]
        u["ttft_s"] += r["key_ttft_s"]
        u["ttft_n"] += r["key_ttft_n"]
        u["samples"] += r["key_ttft_samples"]
        u["cost_s"] += r["cost_s"] or 0.0
    return list(out.values())


def _arm(rows: list[dict]) -> dict:
    units = _by_assignment(rows)
    with_req = [u for u in units if u["n"]]
    with_ttft = [u for u in units if u["ttft_n"]]
    n = sum(u["n"] for u in units)
    return {
        "records": len(rows),
        "assignments": len(units),
        "prefixes": len({u["key"] for u in units}),
        "assignments_with_requests": len(with_req),
        "assignments_with_ttft": len(with_ttft),
        "requests": n,
        "hit_rate": (sum(u["hits"] for u in units) / n) if n else None,
        "cached_tokens_per_request": (sum(u["cached"] for u in units) / n) if n else None,
        "ttft_mean_s": (sum(u["ttft_s"] for u in with_ttft) / sum(u["ttft_n"] for u in with_ttft))
        if with_ttft
        else None,
        "_hit": [u["hits"] / u["n"] for u in with_req],
        "_cached": [u["cached"] / u["n"] for u in with_req],
        "_ttft": [u["ttft_s"] / u["ttft_n"] for u in with_ttft],
        "_samples": [x for u in units for x in u["samples"]],
        "_cost": sum(u["cost_s"] for u in units),
    }


def _compare(treated: list[dict], held: list[dict], samples: bool = False) -> dict:
    """Treated vs held-out assignments: each arm's figures and the per-assignment differences
    (treated minus held out) of hit rate, cached tokens per request and mean TTFT over the
    prefix's requests in the assignment's holds (any engine), each with its 95% interval."""
    t, h = _arm(treated), _arm(held)
    out = {
        "unit": "assignment",
        "treated": {k: v for k, v in t.items() if not k.startswith("_")},
        "held_out": {k: v for k, v in h.items() if not k.startswith("_")},
        "hit_rate_diff": _mean_ci(t["_hit"], h["_hit"]),
        "cached_tokens_diff": _mean_ci(t["_cached"], h["_cached"]),
        "ttft_diff_s": _mean_ci(t["_ttft"], h["_ttft"]),
        "assignments_compared": min(t["assignments_with_ttft"], h["assignments_with_ttft"]),
        "treated_cost_s": t["_cost"],
    }
    if samples:
        out["ttft_samples"] = {"treated": t["_samples"][:2000], "held_out": h["_samples"][:2000]}
    return out


def holdout(window) -> dict:
    """The randomized holdout over the window's assignments: treated = assignments with live
    copies confirmed (or partial), held out = those whose approved items were withheld;
    each measured on its requests during its records' holds, whatever engine served them;
    overall (with the TTFT samples the page plots), per policy and per tenant."""
    treated = window.filter(
        shadow=False, held_out=False, confirmed_at__isnull=False, workload_key__isnull=False
    )
    held = window.filter(held_out=True, workload_key__isnull=False)
    groups = {"policy": "item__plan__policy__name", "tenant": "workload_key__tenant"}

    def rows(qs, field=None):
        return list(qs.values(*_KEY_FIELDS, *([field] if field else [])))

    t_all, h_all = rows(treated), rows(held)
    out = _compare(t_all, h_all, samples=True)
    for name, field in groups.items():
        t_rows, h_rows = rows(treated, field), rows(held, field)
        names = sorted({r[field] or "(none)" for r in t_rows + h_rows})
        out[f"by_{name}"] = [
            {
                name: g,
                **_compare(
                    [r for r in t_rows if (r[field] or "(none)") == g],
                    [r for r in h_rows if (r[field] or "(none)") == g],
                ),
            }
            for g in names
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


def _holdout_verdict(ho: dict, prior: str | None, sweep_note: str) -> dict | None:
    """The verdict from the measured uplift, once enough assignments on each arm carry TTFT."""
    needed = settings.PREWARM_HOLDOUT_MIN_ASSIGNMENTS
    pairs, diff = ho["assignments_compared"], ho["ttft_diff_s"]
    if pairs < needed or diff is None:
        return None
    requests = ho["treated"]["requests"]
    # Uplift per request = held-out TTFT - treated TTFT (positive: treated prefixes were faster).
    up, up_low, up_high = -diff["diff"], -diff["high"], -diff["low"]
    saved, saved_low = up * requests, up_low * requests
    cost = ho["treated_cost_s"]
    figures = (
        f"the randomized holdout ({pairs} treated and held-out assignments with TTFT each; "
        f"{needed} needed) measures {up * 1000:+.0f} ms of TTFT per "
        f"request on treated prefixes (95% interval {up_low * 1000:+.0f} to {up_high * 1000:+.0f} "
        f"ms), {saved:.1f}s over their {requests} requests, for {cost:.1f}s spent placing them"
    )
    base = {"prior": prior, "holdout_assignments": pairs}
    if saved_low > 0 and saved_low > cost:
        return {
            **base,
            "verdict": "speculation_pays",
            "basis": "holdout",
            "tenants_that_benefit": [
                t["tenant"]
                for t in ho["by_tenant"]
                if t["ttft_diff_s"] and t["ttft_diff_s"]["high"] < 0
            ],
            "text": f"Speculation pays: {figures} ({sweep_note}).",
        }
    if cost >= AVOID_MIN_LINK_S and cost > 2 * max(0.0, up_high * requests):
        return {
            **base,
            "verdict": "avoid",
            "basis": "holdout",
            "tenants_that_benefit": [],
            "text": f"Avoid speculation here: {figures}; placing replicas costs more than even "
            f"the interval's best case saves ({sweep_note}).",
        }
    return {
        **base,
        "verdict": "reactive_enough",
        "basis": "holdout",
        "tenants_that_benefit": [],
        "text": f"Reactive replication is enough: {figures}; the gain does not clearly exceed "
        f"what placing replicas costs ({sweep_note}).",
    }


def recommendation(live: dict, shadow: dict, by_tenant: list[dict], ho: dict | None = None) -> dict:
    """A plain verdict on whether speculation earns its cost here, from evidence.

    1. The randomized holdout, once ``PREWARM_HOLDOUT_MIN_ASSIGNMENTS`` treated and held-out
       assignments carry TTFT: the measured uplift (with its 95% interval) times the treated requests
       against what placing the replicas cost (``basis = "holdout"``).
    2. Otherwise the cluster's own scored replicas (live and shadow): counterfactual credit (at
       most one prefill per used replica) against placement cost (warm-up prefill, copy link
       time). Fewer than ``PREWARM_SCOREBOARD_MIN_REPLICAS`` scored: ``insufficient_data``.
    3. The simulator's map is a prior only where this cluster can be placed on it
       (``where_on_the_map``); it answers what scores cannot, whether a reactive copy made once
       demand turns hot would have done as well. Its ``reactive-enough`` counts only where its
       interval rules out a material gain (``MATERIAL_GAIN``); elsewhere ``"uncertain"``.

    Returns ``{"verdict", "basis", "prior", "tenants_that_benefit", "holdout_assignments", "text"}``.
    """
    sweep_note, tip = where_on_the_map()
    prior = _prior(tip)
    ho = ho or {"assignments_compared": 0, "ttft_diff_s": None}
    measured = _holdout_verdict(ho, prior, sweep_note)
    if measured is not None:
        return measured
    pairs = ho["assignments_compared"]
    pairs_note = (
        f"; the holdout has {pairs} of the {settings.PREWARM_HOLDOUT_MIN_ASSIGNMENTS} treated "
        "and held-out assignments with TTFT its measured uplift needs"
    )
    scored = live["scored"] + shadow["scored"]
    needed = getattr(settings, "PREWARM_SCOREBOARD_MIN_REPLICAS", MIN_SCORED_FOR_VERDICT)
    if scored < needed:
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
            "verdict": "insufficient_data",
            "basis": "map" if prior else "none",
            "prior": prior,
            "holdout_assignments": pairs,
            "tenants_that_benefit": [],
            "text": text + ".",
        }
    hits = [
        t["tenant"]
        for t in by_tenant
        if t["precision"] is not None
        and t["precision"] >= MIN_USEFUL_PRECISION
        and t["ttft_saved_s"] > t["cost_s"]
    ]
    best = max((m for m in (live, shadow) if m["scored"]), key=lambda m: m["precision"] or 0)
    which = "live" if best is live else "shadow"
    cost_s = best["cost_s"]
    own = _own_evidence(best, hits, cost_s)
    scores = (
        f"{best['precision']:.0%} of {best['scored']} scored {which} replicas were used, "
        f"credited {best['ttft_saved_s']:.1f}s of time to first token (at most one prefill "
        f"each, {best['saving_basis']}) for {cost_s:.1f}s spent placing them{pairs_note}"
    )
    base = {"prior": prior, "holdout_assignments": pairs}
    if own == "waste":
        return {
            **base,
            "verdict": "avoid",
            "basis": "own scores",
            "tenants_that_benefit": [],
            "text": f"{scores}: speculation costs more than it saves here. Turn it off (or "
            f"keep it in shadow mode) and rely on reactive replication ({sweep_note}).",
        }
    if own == "pays" and prior == "reactive_enough":
        return {
            **base,
            "verdict": "reactive_enough",
            "basis": "own scores and map",
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
            "basis": "own scores and map" if prior == "speculation_pays" else "own scores",
            "tenants_that_benefit": hits,
            "text": f"{scores}. Speculation pays for {', '.join(hits[:8])}; keep reactive "
            f"replication for the other tenants ({sweep_note}).",
        }
    if prior == "avoid":
        return {
            **base,
            "verdict": "avoid",
            "basis": "own scores and map",
            "tenants_that_benefit": [],
            "text": f"{scores}, and the simulator's map says speculation hurts at this "
            f"cluster's placement time and load: {sweep_note}. Turn it off.",
        }
    return {
        **base,
        "verdict": "reactive_enough",
        "basis": "own scores" if prior is None else "own scores and map",
        "tenants_that_benefit": hits,
        "text": f"{scores}: speculation does not earn its cost here. Reactive replication is "
        f"enough on this cluster ({sweep_note}).",
    }


def scoreboard(since: datetime | None = None, until: datetime | None = None) -> dict:
    """Scores of replicas placed in [since, until) (default: the last 7 days)."""
    until = until or timezone.now()
    since = since or until - timedelta(days=7)
    window = SpeculativeReplica.objects.filter(placed_at__gte=since, placed_at__lt=until)
    placed = window.filter(held_out=False)
    live_qs, shadow_qs = placed.filter(shadow=False), placed.filter(shadow=True)
    live, shadow = _metrics(live_qs.aggregate(**_AGG)), _metrics(shadow_qs.aggregate(**_AGG))
    by_tenant = _grouped(placed, "workload_key__tenant", "tenant")
    ho = holdout(window)
    ho["randomization"] = randomization(since, until)
    return {
        "window": {"since": since.isoformat(), "until": until.isoformat()},
        "totals": _public(live),
        "shadow_totals": _public(shadow),
        "by_policy": _grouped(placed, "item__plan__policy__name", "policy", "item__plan__mode"),
        "by_forecaster": _grouped(placed, "forecaster", "forecaster"),
        "by_tenant": by_tenant,
        "holdout": ho,
        "recommendation": recommendation(live, shadow, by_tenant, ho),
    }
