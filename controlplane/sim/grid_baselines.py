"""Each strategy of a grid cell held against the baselines beside it (``seeds.BASELINES``: the
routing-time rule and hot fanout): the gain over each, the worst unsaturated seed against the
better of the two on that seed, and whether the cell is clean against them."""

from __future__ import annotations

from controlplane.sim.seeds import BASELINES, gain_stats, pct, seeds_text

# An unsaturated seed whose p99 is above this x its baseline's (reactive's for predictive; the
# better of the two here) is harm.
HARM_RATIO = 1.25


def worse_beyond_noise(mean: float, noise: float | None) -> bool:
    """A gain below minus its noise; one seed has no noise estimate, so no such verdict."""
    return noise is not None and mean < -noise


def against_baselines(runs: list[dict], kept: list[dict], sat: list[int], name: str) -> dict:
    """``name`` against the baselines beside it (``seeds.BASELINES``) in one cell: its p99 and
    mean gain over each (paired, unsaturated seeds, 95% t noise) and whether it is worse beyond
    noise; its worst unsaturated seed against the better baseline on that seed; ``clean``: worse
    than neither beyond noise and no seed above ``HARM_RATIO`` x the better baseline."""
    out: dict = {}
    worse = False
    for base in BASELINES:
        key = base.replace("-", "_")
        for stat in ("mean", "p99"):
            g = gain_stats(
                [r["policies"][base][f"ttft_{stat}_s"] for r in kept],
                [r["policies"][name][f"ttft_{stat}_s"] for r in kept],
            )
            out[f"over_{key}_{stat}"], out[f"over_{key}_{stat}_noise"] = g["mean"], g["noise"]
            worse = worse or worse_beyond_noise(g["mean"], g["noise"])
    ratios = [
        (
            r["policies"][name]["ttft_p99_s"]
            / max(1e-9, min(r["policies"][b]["ttft_p99_s"] for b in BASELINES)),
            r["seed"],
        )
        for r in runs
        if r["seed"] not in sat
    ]
    worst = max(ratios) if ratios else None
    out["worst_seed_over_best_baseline"] = (
        None if worst is None else {"seed": worst[1], "ratio": worst[0]}
    )
    out["worse_beyond_noise"] = worse
    out["clean"] = not worse and (worst is None or worst[0] <= HARM_RATIO)
    return out


def baselines_markdown(cells: list[dict]) -> str:
    """Each strategy against the routing-time rule and hot fanout, per cell (cells whose runs
    hold both baselines)."""
    rows = [
        "| setting | model | scenario | seeds used (df); left out (why) | "
        "reactive p99 gain over routing-reactive | over hot-fanout | worst seed / better "
        "baseline | predictive p99 gain over routing-reactive | over hot-fanout | worst seed / "
        "better baseline | clean (both) |",
        "|" + "---|" * 11,
    ]
    for c in cells:
        ab = c.get("against_baselines")
        if not ab:
            continue
        parts = []
        for name in ("reactive", "predictive"):
            a = ab[name]
            w = a["worst_seed_over_best_baseline"]
            parts += [
                *(
                    f"{a[f'over_{b}_p99']:+.1%} ± {pct(a[f'over_{b}_p99_noise'])}"
                    for b in ("routing_reactive", "hot_fanout")
                ),
                "-" if w is None else f"seed {w['seed']}: {w['ratio']:.2f}x",
            ]
        clean = ab["reactive"]["clean"] and ab["predictive"]["clean"]
        rows.append(
            f"| {c['setting']} | {c['model']} | {c['scenario']} | {seeds_text(c)} | "
            + " | ".join(parts)
            + f" | {'yes' if clean else '**no**'} |"
        )
    return "\n".join(rows)
