"""The live-vs-sim study's tables (markdown): every pass, live and simulated, then the paired
directions side by side."""

from __future__ import annotations


def _f(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _ci(ci, spec: str = "+.3f") -> str:
    return "no interval" if ci is None else f"[{ci[0]:{spec}}, {ci[1]:{spec}}]"


def _df(c: dict) -> str:
    """The intervals' degrees of freedom: pairs - 1 (older results carry only the pairs)."""
    df = c.get("df", c["pairs"] - 1 if c["pairs"] > 1 else None)
    return "-" if df is None else f"{df:g}"


def pass_rows(result: dict) -> list[str]:
    rows = [
        "| source | seed | strategy | requests | TTFT mean s | TTFT p99 s | plans with items "
        "(cycle / ingest) | items | copies landed | first landed (trace s) | landed on joining "
        "engines before they serve | wall s | load avg before -> after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted(result.get("live_passes", []), key=lambda p: p.get("order", 0)):
        ev, fg = p["evidence"], p["figures"]
        plans = ev["plans_with_items"]
        rows.append(
            f"| live | {p['seed']} | {p['strategy']} | {fg['requests']} | "
            f"{fg['ttft_mean_s']:.3f} | {fg['ttft_p99_s']:.3f} | "
            f"{plans.get('cycle', 0)} / {plans.get('ingest', 0)} | {ev['plan_items']} | "
            f"{ev['landed']} | {_f(ev['first_landed_s'], '.0f')} | "
            f"{ev['on_joining_before_serving']} | {p['wall_s']:.0f} | "
            f"{p['load_before'][0]:.1f} -> {p['load_after'][0]:.1f} |"
        )
    for p in result["sim_passes"]:
        ev, fg = p["evidence"], p["figures"]
        rows.append(
            f"| sim | {p['seed']} | {p['strategy']} | {fg['requests']} | "
            f"{fg['ttft_mean_s']:.3f} | {fg['ttft_p99_s']:.3f} | - | {ev['plan_items']} | "
            f"{ev['landed']} | {_f(ev['first_landed_s'], '.0f')} | "
            f"{ev['on_joining_before_serving']} | - | - |"
        )
    return rows


def direction_rows(result: dict) -> list[str]:
    rows = [
        "| figure | source | pairs | t df | reactive - predictive, mean s [95% t] | gain, mean "
        "[95% t] | direction |",
        "|---|---|---|---|---|---|---|",
    ]
    for stat, label in (("ttft_p99_s", "p99 TTFT"), ("ttft_mean_s", "mean TTFT")):
        for source in ("live", "sim"):
            c = result.get(source, {}).get(stat)
            if c is None:
                continue
            rows.append(
                f"| {label} | {source} | {c['pairs']} | {_df(c)} | {c['diff_mean_s']:+.3f} "
                f"{_ci(c['diff_ci95_s'])} | {c['gain_mean']:+.1%} "
                f"{_ci(c['gain_ci95'], '+.1%')} | {c['direction']} |"
            )
    for name, v in result.get("sim_variants", {}).items():
        c = v["p99"]
        rows.append(
            f"| p99 TTFT | sim: {name} | {c['pairs']} | {_df(c)} | {c['diff_mean_s']:+.3f} "
            f"{_ci(c['diff_ci95_s'])} | {c['gain_mean']:+.1%} "
            f"{_ci(c['gain_ci95'], '+.1%')} | {c['direction']} |"
        )
    return rows


def markdown(result: dict) -> str:
    out = [
        f"{result['engines']} engines, {result['tenants']} tenants, seeds {result['seeds']}, TTFT of requests after "
        f"{result['warmup_s']:g} trace s",
        "",
        *pass_rows(result),
        "",
        *direction_rows(result),
    ]
    if "agreement_p99" in result:
        out += ["", f"p99 direction, live against the simulator: {result['agreement_p99']}"]
    return "\n".join(out)
