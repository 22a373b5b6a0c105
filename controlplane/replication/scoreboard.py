"""The scoreboard: what speculative replicas bought and what they cost, per policy, forecaster, tenant.

The shape is the one `GET /api/scoreboard/` returns, so the dashboard and the API share it:
``{"window", "totals", "shadow_totals", "by_policy", "by_forecaster", "by_tenant", "recommendation"}``
with each metric block M = ``{"replicas", "hits", "hits_basis", "hits_measured_replicas",
"precision", "bytes_moved", "vram_byte_seconds", "host_byte_seconds", "ttft_saved_s"}``.
Precision is the share of *scored* replicas that were hit at least once (None until one is
scored). ``hits_basis`` says where the hits come from: ``measured`` (every scored replica's hits
are requests its engine served with the prefix cached, from gateways' records), ``estimated``
(none: records name no serving engine, or shadow replicas) or ``mixed``. Bytes moved are what
executors reported; VRAM held counts GPU-tier replicas only, host memory is apart.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.utils import timezone

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.models import Engine
from controlplane.sim.speculation_map import advice, load_map

from .models import SpeculativeReplica

# Below this many scored replicas no verdict is honest (PREWARM_SCOREBOARD_MIN_REPLICAS).
MIN_SCORED_FOR_VERDICT = 20
# Precision under which most replicas are waste, whatever TTFT the few hits saved.
MIN_USEFUL_PRECISION = 0.2

_AGG = {
    "replicas": Count("id"),
    "scored": Count("id", filter=Q(scored_at__isnull=False)),
    "scored_hit": Count("id", filter=Q(scored_at__isnull=False, hits__gt=0)),
    "hits": Sum("hits"),
    "measured": Count("id", filter=Q(scored_at__isnull=False, hits_measured=True)),
    "bytes_moved": Sum("bytes_moved"),
    "nominal_bytes": Sum("bytes"),
    "vram_byte_seconds": Sum("vram_byte_seconds"),
    "host_byte_seconds": Sum("host_byte_seconds"),
    "ttft_saved_s": Sum("ttft_saved_s"),
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
        "scored": scored,
        "nominal_bytes": row.get("nominal_bytes") or 0,
    }


_PRIVATE = ("scored", "nominal_bytes")


def _public(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in _PRIVATE}


def _copy_bytes(m: dict, shadow: bool) -> int:
    """The bytes the verdict charges the replicas' copies with: what the executors reported for
    live replicas, and for shadow replicas (never copied) what their copies would have moved."""
    return m["nominal_bytes"] if shadow else m["bytes_moved"]


def _grouped(qs, field: str, name: str, extra: str | None = None) -> list[dict]:
    fields = [field] + ([extra] if extra else [])
    out = []
    for row in qs.values(*fields).annotate(**_AGG).order_by(field):
        entry = {name: row[field] if row[field] not in (None, "") else "(none)"}
        if extra:
            entry["mode"] = row[extra]
        out.append({**entry, **_public(_metrics(row))})
    return out


def where_on_the_map() -> tuple[str, dict | None]:
    """This cluster's place on the simulator's map of where speculation pays.

    Copy time = mean bytes of the workload keys' shared prefixes over the link speed left by
    serving traffic (link x (1 - load)); load = mean KV usage the engines report. Returns a
    sentence and the map's advice (None when the fleet or the map cannot say).
    """
    engines = list(Engine.objects.values("block_size", "bytes_per_block", "metrics"))
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
    loads = [
        float(e["metrics"].get("kv_usage"))
        for e in engines
        if isinstance((e["metrics"] or {}).get("kv_usage"), int | float)
    ]
    load = sum(loads) / len(loads) if loads else settings.PREWARM_DEFAULT_ENGINE_LOAD
    load = min(max(load, 0.0), 0.95)
    copy_s = (
        (sum(tokens) / len(tokens))
        * (sum(per_token) / len(per_token))
        / (settings.PREWARM_LINK_BYTES_PER_S * (1 - load))
    )
    try:
        doc = load_map()
        tip = advice(copy_s / doc["burst_onset_s"], load, doc)
    except ValueError as exc:
        return f"the simulator's map is unavailable ({exc})", None
    where = (
        f"copies here take ~{copy_s:.2f}s ({copy_s / doc['burst_onset_s']:.2f} of a "
        f"{doc['burst_onset_s']:.0f}s burst onset) at load {load:.2f}; the simulator's map says "
        f"'{tip['verdict']}' there (predictive vs reactive p99 {tip['expected_gain_p99']:+.1%}, "
        f"seed noise {tip['noise_p99']:.1%})"
    )
    return where, tip


# Copies that held the links this much longer than the TTFT they saved (and at least this many
# seconds of link time) did harm: the verdict says to turn speculation off.
AVOID_MIN_LINK_S = 1.0
_PRIOR = {"speculate": "speculation_pays", "reactive-enough": "reactive_enough", "avoid": "avoid"}
# A map cell says "reactive is enough" with authority only where its interval rules out a gain
# this large (predictive's p99 gain + its seed noise below it); a wider cell is no evidence
# either way, and the cluster's own scores decide.
MATERIAL_GAIN = 0.05


def _prior(tip: dict | None) -> str | None:
    if not tip:
        return None
    prior = _PRIOR.get(tip["verdict"])
    if prior == "reactive_enough" and tip["expected_gain_p99"] + tip["noise_p99"] >= MATERIAL_GAIN:
        return "uncertain"
    return prior


def _own_evidence(best: dict, hits: list[str], copy_s: float) -> str:
    """What the cluster's own scored replicas say: ``pays`` (used, and saved more than their
    copies cost), ``waste`` (mostly unused and cost far more link time than they saved) or
    ``neutral``."""
    precision = best["precision"] or 0.0
    if precision >= MIN_USEFUL_PRECISION and best["ttft_saved_s"] > copy_s and hits:
        return "pays"
    if (
        precision < MIN_USEFUL_PRECISION
        and copy_s >= AVOID_MIN_LINK_S
        and copy_s > 2 * best["ttft_saved_s"]
    ):
        return "waste"
    return "neutral"


def recommendation(live: dict, shadow: dict, by_tenant: list[dict]) -> dict:
    """A plain verdict on whether speculation earns its cost here.

    The cluster's own scored replicas (live and shadow) are weighed first: were they used, and
    did they save more prefill time than their copies held the links (bytes moved / link speed)?
    The simulator's map of where speculation pays is the prior: it answers what the scores
    cannot, whether at this cluster's copy speed and load a reactive copy made once demand turns
    hot would have done as well (a used replica whose reactive copy lands in a fraction of a
    second bought little). So:

    - fewer than ``PREWARM_SCOREBOARD_MIN_REPLICAS`` scored: ``insufficient_data``, with the
      map's verdict at this cluster's place as the ``prior`` (``basis`` = ``"map"``);
    - replicas used and worth their cost: ``speculation_pays`` unless the map says a reactive
      copy does as well here (``reactive_enough``);
    - replicas mostly unused and costing far more link time than they saved: ``avoid``
      (turn speculation off), whatever the map says;
    - otherwise the map's verdict, ``reactive_enough`` where it has none or says ``speculate``
      (the scores do not confirm it).

    The map's ``reactive-enough`` counts only where its interval rules out a material gain
    (``MATERIAL_GAIN``); elsewhere the prior is ``"uncertain"`` and the scores decide.

    Returns ``{"verdict", "basis", "prior", "tenants_that_benefit", "text"}``; ``basis`` is
    ``"own scores"``, ``"own scores and map"``, ``"map"`` (too few scores: only the prior) or
    ``"none"``; ``prior`` is the map's verdict (None where the cluster cannot be placed on it).
    """
    sweep_note, tip = where_on_the_map()
    prior = _prior(tip)
    scored = live["scored"] + shadow["scored"]
    needed = getattr(settings, "PREWARM_SCOREBOARD_MIN_REPLICAS", MIN_SCORED_FOR_VERDICT)
    if scored < needed:
        text = (
            f"Only {scored} speculative replicas have been scored (live and shadow); at least "
            f"{needed} are needed before this cluster's own verdict means anything. Keep the "
            f"policy in shadow mode and look again later ({sweep_note})"
        )
        if prior is not None:
            text += (
                f". Until then the prior is the simulator's map: "
                f"'{prior.replace('_', ' ')}' at this cluster's copy speed and load"
            )
            if prior == "uncertain":
                text += " (its seeds neither show a gain nor rule one out)"
        return {
            "verdict": "insufficient_data",
            "basis": "map" if prior else "none",
            "prior": prior,
            "tenants_that_benefit": [],
            "text": text + ".",
        }
    link = settings.PREWARM_LINK_BYTES_PER_S
    hits = [
        t["tenant"]
        for t in by_tenant
        if t["precision"] is not None
        and t["precision"] >= MIN_USEFUL_PRECISION
        and t["ttft_saved_s"] > t["bytes_moved"] / link
    ]
    best = max((m for m in (live, shadow) if m["scored"]), key=lambda m: m["precision"] or 0)
    which = "live" if best is live else "shadow"
    copy_s = _copy_bytes(best, best is shadow) / link
    own = _own_evidence(best, hits, copy_s)
    scores = (
        f"{best['precision']:.0%} of {best['scored']} scored {which} replicas were used, "
        f"saving {best['ttft_saved_s']:.1f}s of time to first token for {copy_s:.1f}s of "
        "link time"
    )
    if own == "waste":
        return {
            "verdict": "avoid",
            "basis": "own scores",
            "prior": prior,
            "tenants_that_benefit": [],
            "text": f"{scores}: speculation costs more than it saves here. Turn it off (or "
            f"keep it in shadow mode) and rely on reactive replication ({sweep_note}).",
        }
    if own == "pays" and prior == "reactive_enough":
        return {
            "verdict": "reactive_enough",
            "basis": "own scores and map",
            "prior": prior,
            "tenants_that_benefit": [],
            "text": f"{scores}, but copies are fast next to a burst's onset here, so a reactive "
            f"copy made after demand turns hot would have served nearly as well: "
            f"{sweep_note}. Reactive replication is enough on this cluster; keep "
            "speculation off or in shadow mode.",
        }
    if own == "pays":
        basis = "own scores and map" if prior == "speculation_pays" else "own scores"
        return {
            "verdict": "speculation_pays",
            "basis": basis,
            "prior": prior,
            "tenants_that_benefit": hits,
            "text": f"{scores}. Speculation pays for {', '.join(hits[:8])}; keep reactive "
            f"replication for the other tenants ({sweep_note}).",
        }
    if prior == "avoid":
        return {
            "verdict": "avoid",
            "basis": "own scores and map",
            "prior": prior,
            "tenants_that_benefit": [],
            "text": f"{scores}, and the simulator's map says speculation hurts at this "
            f"cluster's copy speed and load: {sweep_note}. Turn it off.",
        }
    return {
        "verdict": "reactive_enough",
        "prior": prior,
        "basis": "own scores" if prior is None else "own scores and map",
        "tenants_that_benefit": hits,
        "text": f"{scores}: speculation does not earn its VRAM and bandwidth here. Reactive "
        f"replication is enough on this cluster ({sweep_note}).",
    }


def scoreboard(since: datetime | None = None, until: datetime | None = None) -> dict:
    """Scores of replicas placed in [since, until) (default: the last 7 days)."""
    until = until or timezone.now()
    since = since or until - timedelta(days=7)
    window = SpeculativeReplica.objects.filter(placed_at__gte=since, placed_at__lt=until)
    live_qs, shadow_qs = window.filter(shadow=False), window.filter(shadow=True)
    live, shadow = _metrics(live_qs.aggregate(**_AGG)), _metrics(shadow_qs.aggregate(**_AGG))
    by_tenant = _grouped(window, "workload_key__tenant", "tenant")
    return {
        "window": {"since": since.isoformat(), "until": until.isoformat()},
        "totals": _public(live),
        "shadow_totals": _public(shadow),
        "by_policy": _grouped(window, "item__plan__policy__name", "policy", "item__plan__mode"),
        "by_forecaster": _grouped(window, "forecaster", "forecaster"),
        "by_tenant": by_tenant,
        "recommendation": recommendation(live, shadow, by_tenant),
    }
