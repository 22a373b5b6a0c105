"""Named virtual-cluster setups: ``burst`` (speculation pays), ``steady`` (it does not) and
``headline`` (the simulator's headline scale-out cell, for checking its direction live).

``burst``: a 70B-class model on 4 x H100 per engine, the busiest ServeGen tenants with long
shared prefixes (8k-128k tokens), replayed from the window with the steepest demand ramp, on a
cluster that scales out (the ``scaleout`` scenario: half the engines at the start, the others
announced and joining as the ramp climbs). A cold engine joining a ramp has to recompute every
long prefix it is sent; a copy made before it serves saves seconds per request.

``steady``: an 8B model on one H100 per engine, shorter prefixes (2k-32k tokens), a window with
flat demand and a fixed fleet: caches are warm and recomputing a short prefix is cheap, so
replicas have little to win.

``headline``: the simulator's headline scale-out cell (``prewarm-sim grid --cells
servegen:llama3-70b:scaleout``): ServeGen m-large, 70B, 30 tenants, load 0.55 at the busiest 5
minutes, 16 engines (half joining on the scenario's own schedule), a 1,200 s window from the
steepest ramp; the same ``scenarios.build`` call as the grid's, so a seed replays the same
requests. ``--engines`` scales the fleet (the load per engine stays 0.55), ``--tenants`` the
tenants (30 tenants on 4 engines saturate them: their prefixes do not fit 4 engines' KV).

``time_scale`` compresses the trace so that the ramp (and the engine joining in it) comes within
the first two minutes; ``load`` sets the request rate (ServeGen's rates scaled to put that load
on the fleet), kept modest so that a laptop can post every record and publish every event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.sim.cluster import EngineChange
from controlplane.sim.scenarios import Setup, build, bundled_path
from controlplane.sim.workloads import servegen as sg


@dataclass(frozen=True)
class Preset:
    name: str
    scenario: str
    model: str
    engines: int
    tenants: int
    load: float
    duration_s: float  # trace seconds replayed (then looped)
    time_scale: float
    steady_window: bool = False
    description: str = ""
    # Engines that join: (engine, announced at, serves from), trace seconds. Replaces the
    # scenario's own schedule so that the joins fall in the ramp of the replayed window.
    joins: tuple[tuple[int, float, float], ...] = ()


PRESETS = {
    # The window's demand more than quadruples between trace minutes 8 and 11; engines 4 and 5
    # (of 6) are announced as it starts and serve two minutes (cold boot) later.
    "burst": Preset(
        "burst",
        "scaleout",
        "llama3-70b",
        6,
        12,
        0.25,
        1800.0,
        10.0,
        description="70B, long tenant prefixes, demand ramp, engines joining",
        joins=((4, 420.0, 540.0), (5, 480.0, 600.0)),
    ),
    "steady": Preset(
        "steady",
        "steady",
        "llama3-8b",
        4,
        12,
        0.25,
        1800.0,
        10.0,
        True,
        description="8B, short prefixes, flat demand, fixed fleet",
    ),
    # The grid's cell: the scenario's own joins (``scenarios.scaleout_schedule``), not a preset's.
    "headline": Preset(
        "headline",
        "scaleout",
        "llama3-70b",
        16,
        30,
        0.55,
        1200.0,
        10.0,
        description="the headline scale-out cell: 70B, 30 tenants, load 0.55, half the fleet joining",
    ),
}


def flattest_start(duration_s: float) -> float:
    """Start of the window (after a day of history) whose demand changes least over
    ``duration_s``: the steady counterpart of ``servegen.ramp_start``."""
    tenants = sg.load_servegen_windows(bundled_path("servegen"))
    starts, total = sg.aggregate_rate(tenants)
    w = starts[1] - starts[0] if len(starts) > 1 else 600.0
    span = max(1, int(round(duration_s / w)))
    best, best_t = np.inf, float(starts[0])
    for i in range(len(starts) - span):
        if starts[i] < starts[0] + sg.DAY_S or total[i] <= 0:
            continue
        seg = total[i : i + span + 1]
        spread = float(seg.max() / max(seg.min(), 1e-9))
        if spread < best:
            best, best_t = spread, float(starts[i])
    return best_t


def build_preset(
    name: str, *, engines: int | None = None, tenants: int | None = None, seed: int = 0
) -> tuple[Setup, Preset]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    p = PRESETS[name]
    start = flattest_start(p.duration_s) if p.steady_window else None
    setup = build(
        workload="servegen",
        scenario=p.scenario,
        engines=engines or p.engines,
        model=p.model,
        start=start,
        duration=p.duration_s,
        load=p.load,
        tenants=tenants or p.tenants,
        seed=seed,
    )
    if p.joins:
        setup.config.changes = tuple(
            EngineChange(e, a, s) for e, a, s in p.joins if e < setup.config.engines
        )
        setup.assumptions["scaleout"] = "; ".join(
            f"e{e} announced at {a:.0f} s, serves from {s:.0f} s" for e, a, s in p.joins
        )
    setup.assumptions["preset"] = f"{p.name}: {p.description}"
    return setup, p
