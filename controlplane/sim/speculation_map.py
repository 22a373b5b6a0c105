"""Where speculation pays: the sweep's map, and the advice the control plane gives from it.

``controlplane/sim/data/speculation_map.json`` is written by ``prewarm-sim sweep --json``
(``make speculation-map``, ``MAP_COMMAND``) and committed; the scoreboard's recommendation reads
it through ``load_map`` and ``advice``. The map records the policy version it was made with;
``stale`` says when that is older than the policy's. Pure Python (no Django, no numpy).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from controlplane.core.policy.version import POLICY_VERSION

MAP_PATH = Path(__file__).with_name("data") / "speculation_map.json"
# What regenerates the committed map (the Makefile's speculation-map target runs the sweep).
MAP_COMMAND = "make speculation-map"
VERDICTS = ("speculate", "reactive-enough", "avoid")


def stale(doc: dict) -> str:
    """Why the map ``doc`` is older than the policy (its ``policy_version`` below
    ``POLICY_VERSION``, or none recorded), or ``""`` when it is not."""
    made_with = doc.get("policy_version")
    if not isinstance(made_with, int):
        return f"the speculation map records no policy version: regenerate it ({MAP_COMMAND})"
    if made_with < POLICY_VERSION:
        return (
            f"the speculation map was made with policy version {made_with}, the policy is at "
            f"{POLICY_VERSION}: regenerate it ({MAP_COMMAND})"
        )
    return ""


def load_map(path: str | Path | None = None) -> dict:
    """The sweep's map. Schema (a JSON object)::

        {
          "policy_version": 1,            # the policy it was made with (``stale``)
          "burst_onset_s": 60.0,          # onset a copy time is compared with
          "model": "llama3-70b", "gpu": "h100", "engines": 16, "duration_s": 1800.0,
          "seeds": [0, 1, 2],             # every cell is the mean over these seeds
          "noise": {"p99": x, "mean": x}, # fallback noise: the largest per-cell noise below
          "noise_kind": "...",            # how the noise was measured
          "cells": [
            {"prefix_tokens": [lo, hi],   # tenant prefixes, log-uniform in [lo, hi] tokens
             "link_gbytes_per_s": x,      # cross-node link, shared with serving traffic
             "load": x,                   # target utilisation
             "copy_s": x,                 # mean prefix bytes / (link x (1 - load))
             "copy_to_onset": x,          # copy_s / burst_onset_s
             "predictive_gain_p99": x, "predictive_gain_mean": x,   # (reactive - p) / reactive
             "everywhere_gain_p99": x, "everywhere_gain_mean": x,   # the ceiling (optional)
             "predictive_gain_p99_noise": x,    # per cell: 95% CI half-width of the mean
             "predictive_gain_mean_noise": x,   # paired gain over seeds (Student t)
             "predictive_gain_p99_per_seed": [x, ...],   # the paired gains themselves
             "predictive_gain_p99_spread": x,   # max - min over seeds
             "ttft_s": {"reactive": {"mean": x, "p99": x}, "predictive": {...}, ...},
             "spec_vram_fraction_mean": x, "replica_precision": x or null}   # predictive's
          ]
        }

    Raises ``ValueError`` on a file that is not such a map (nothing is cached).
    """
    p = Path(path) if path else MAP_PATH
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read speculation map {p}: {exc}") from exc
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if not cells or not isinstance(cells, list):
        raise ValueError(f"speculation map {p} has no cells")
    for c in cells:
        for key in (
            "copy_to_onset",
            "load",
            "predictive_gain_p99",
            "predictive_gain_mean",
        ):
            if not isinstance(c.get(key), (int, float)):
                raise ValueError(f"speculation map {p}: a cell lacks numeric {key!r}")
    return doc


def advice(copy_time_over_onset: float, load: float, doc: dict | None = None) -> dict:
    """Advice for a cluster whose copies take ``copy_time_over_onset`` of a burst's onset at
    utilisation ``load``: the nearest measured cell (log distance in the ratio, linear in load)
    and its verdict.

    ``speculate``: predictive beats reactive on p99 by more than the cell's seed noise and is
    not worse on the mean beyond it; ``avoid``: predictive is worse than reactive beyond the
    noise on p99 or mean (turn speculation off); ``reactive-enough``: anything else (nothing to
    gain beyond noise). The noise is the cell's own (``predictive_gain_*_noise``) where the map
    has it, else the map-wide ``noise``.
    Returns ``{"verdict", "expected_gain_p99", "expected_gain_mean", "ceiling_gain_p99",
    "noise_p99", "noise_mean", "cell": {"copy_to_onset", "load", "prefix_tokens",
    "link_gbytes_per_s"}}``.
    """
    if not (copy_time_over_onset > 0 and math.isfinite(copy_time_over_onset)):
        raise ValueError("copy_time_over_onset must be a positive number")
    if not 0.0 <= load <= 1.5:
        raise ValueError("load must be in [0, 1.5]")
    doc = doc or load_map()
    x = math.log10(copy_time_over_onset)

    def dist(c: dict) -> float:
        return abs(math.log10(max(c["copy_to_onset"], 1e-9)) - x) + abs(c["load"] - load) * 2.0

    cell = min(doc["cells"], key=dist)
    noise = doc.get("noise", {})
    n99 = _noise(cell.get("predictive_gain_p99_noise"), noise.get("p99", 0.0))
    nmean = _noise(cell.get("predictive_gain_mean_noise"), noise.get("mean", 0.0))
    g99, gmean = float(cell["predictive_gain_p99"]), float(cell["predictive_gain_mean"])
    if g99 > n99 and gmean >= -nmean:
        verdict = "speculate"
    elif g99 < -n99 or gmean < -nmean:
        verdict = "avoid"
    else:
        verdict = "reactive-enough"
    return {
        "verdict": verdict,
        "expected_gain_p99": g99,
        "expected_gain_mean": gmean,
        # The everywhere ceiling's gain where the map ran it (None in maps made before).
        "ceiling_gain_p99": cell.get("everywhere_gain_p99"),
        "noise_p99": n99,
        "noise_mean": nmean,
        "cell": {
            k: cell.get(k) for k in ("copy_to_onset", "load", "prefix_tokens", "link_gbytes_per_s")
        },
    }


def _noise(cell_noise, fallback) -> float:
    """The cell's own noise when it is a finite number, else the map-wide figure."""
    if isinstance(cell_noise, (int, float)) and math.isfinite(cell_noise):
        return float(cell_noise)
    return float(fallback or 0.0)
