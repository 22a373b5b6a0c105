"""Where this cluster sits on the simulator's map of where speculation pays: the verdict's
prior, used only where the cluster can be placed on the map."""

from __future__ import annotations

from django.conf import settings

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.models import Engine
from controlplane.sim.speculation_map import advice, load_map

from ..choices import Transport
from ..models import Policy
from ..plans.costs import cost_model_for, placement_cost


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
