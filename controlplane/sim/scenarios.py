"""Scenarios: the cluster shape around a workload (``steady``, ``scaleout``, ``tiered``,
``slowlink``), and the bundled workloads with their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from controlplane.core.costmodel import CPU_TIER_BYTES_PER_S, DISK_TIER_BYTES_PER_S, CostModel
from controlplane.core.traces.paths import shared_data_dir
from controlplane.sim.cluster import ClusterConfig, EngineChange, TierSpec
from controlplane.sim.workloads import servegen as sg
from controlplane.sim.workloads.azure import load_azure
from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload
from controlplane.sim.workloads.mooncake import load_mooncake
from wire.protocol import TIER_CPU, TIER_DISK

SCENARIOS = ("steady", "scaleout", "tiered", "slowlink")
WORKLOADS = ("mooncake", "azure-code", "servegen")
FORMATS = ("mooncake", "azure", "servegen")

# Stated assumptions of the scenarios (printed in the report).
STEADY_NETWORK_BPS = 25e9  # 200 Gb/s RDMA NIC per engine
SLOW_NETWORK_BPS = 12.5e9  # 100 Gb/s


def link_bytes_per_s(scenario: str) -> float:
    """Cross-node copy bandwidth a scenario assumes (what the control plane should price copies at)."""
    return SLOW_NETWORK_BPS if scenario == "slowlink" else STEADY_NETWORK_BPS


CPU_TIER_BPS, SSD_TIER_BPS = CPU_TIER_BYTES_PER_S, DISK_TIER_BYTES_PER_S  # core/costmodel.py
TIERED_GPU_SHARE = 0.5  # share of HBM KV left to cached prefixes when tiers hold the rest
BOOT_S = 120.0  # an engine joining a scale-out is announced this long before it serves
# Routers that balance load (SGLang's cache-aware router, llm-d's load scorer) send a request to
# the shortest queue when the cache-aware choice is this much longer: new engines take traffic.
BALANCE_WAIT_S = 0.5


@dataclass
class Setup:
    config: ClusterConfig
    workload: Workload
    assumptions: dict[str, str] = field(default_factory=dict)


def bundled_path(workload: str) -> Path:
    root = shared_data_dir() / "traces"
    return {
        "mooncake": root / "mooncake" / "conversation_trace.jsonl",
        "azure-code": root / "azure2023" / "AzureLLMInferenceTrace_code.csv",
        "servegen": root / "servegen-m-large",
    }[workload]


def build(
    *,
    workload: str | None = "servegen",
    trace: str | None = None,
    fmt: str | None = None,
    trace_dir: str | None = None,
    scenario: str = "steady",
    engines: int = 16,
    model: str = "llama3-70b",
    gpu: str = "h100",
    gpus_per_engine: int | None = None,
    kv_capacity_gb: float | None = None,
    start: float | None = None,
    duration: float | None = None,
    time_scale: float = 1.0,
    load: float = 0.55,
    tenants: int = 30,
    prefix_tokens: tuple[int, int] | None = None,
    seed: int = 0,
    clients: str = "all",
) -> Setup:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    if engines < 1:
        raise ValueError("need at least 1 engine")
    if scenario == "scaleout" and engines < 2:
        raise ValueError("scaleout needs at least 2 engines (half of them join later)")
    if not 0 < load < 1.5:
        raise ValueError("load must be in (0, 1.5)")
    cost = CostModel.preset(model, gpu, gpus_per_engine)
    block_bytes = BLOCK_TOKENS * cost.kv_bytes_per_token
    cap_bytes = kv_capacity_gb * 1e9 if kv_capacity_gb else cost.default_kv_capacity_bytes()
    blocks = int(cap_bytes // block_bytes)
    if blocks < 8:
        raise ValueError("KV capacity below 8 blocks per engine")
    kind, path = _trace_source(workload, trace, fmt, trace_dir)
    if clients != "all" and kind != "servegen":
        raise ValueError("client halves (--clients) need a ServeGen workload")
    if kind == "servegen":
        wl = _servegen(
            path,
            scenario,
            engines,
            cost,
            start,
            duration,
            load,
            tenants,
            prefix_tokens or _default_prefix_tokens(model),
            seed,
            clients,
        )
    else:
        wl = load_mooncake(path) if kind == "mooncake" else load_azure(path, seed=seed)
        if start or duration:
            wl = wl.window(start or 0.0, duration)
    if time_scale != 1.0:
        wl = wl.scaled(time_scale)
    if len(wl) == 0:
        raise ValueError("the chosen window holds no requests")
    per_node = max(1, 8 // cost.gpus)
    cfg = ClusterConfig(
        cost,
        engines,
        blocks,
        engines_per_node=per_node,
        scenario=scenario,
        network_bytes_per_s=STEADY_NETWORK_BPS,
    )
    notes = _shape(cfg, wl)
    if kind == "servegen":
        notes["load"] = _load_note(cfg, wl, load)
    notes["engine"] = ENGINE_NOTE
    notes["cost_model"] = (
        f"prefill at {cost.mfu:.0%} MFU of {cost.gpus} x {cost.gpu.name} "
        f"+ {cost.batch_overhead_s * 1e3:.0f} ms per batch"
    )
    return Setup(cfg, wl, {**wl.assumptions, **notes})


ENGINE_NOTE = (
    "prefill servers (FIFO); TTFT = queueing + prefill of the uncached part "
    "+ any tier promotion the queue does not hide"
)


def _load_note(cfg: ClusterConfig, wl: Workload, load: float) -> str:
    """The ServeGen load asked for, and what this draw offers."""
    ol = offered_load(cfg, wl)
    return (
        f"rates scaled so the busiest 5 minutes of expected demand put {load:.2f} "
        f"on the fleet; this draw offers {ol['peak_5min']:.2f} in its busiest "
        f"5 minutes and {ol['mean']:.2f} on average"
    )


def _trace_source(
    workload: str | None, trace: str | None, fmt: str | None, trace_dir: str | None
) -> tuple[str, Path]:
    """The trace's format and path: a folder of ServeGen files, a named trace file or a
    bundled workload."""
    if trace_dir:
        # Any folder of ServeGen-format client files (``chunk-<id>-trace.csv``): the same runs
        # on another category without code changes.
        if trace:
            raise ValueError("give --trace or --trace-dir, not both")
        path = Path(trace_dir)
        if not path.is_dir():
            raise ValueError(f"--trace-dir is not a folder: {path}")
        if not any(path.glob("*-trace.csv")):
            raise ValueError(f"--trace-dir holds no ServeGen client files (*-trace.csv): {path}")
        return "servegen", path
    if trace:
        if fmt not in FORMATS:
            raise ValueError(f"--format must be one of {', '.join(FORMATS)}")
        path = Path(trace)
        if not path.exists():
            raise ValueError(f"trace not found: {path}")
        return fmt, path
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    return {"azure-code": "azure"}.get(workload, workload), bundled_path(workload)


def _shape(cfg: ClusterConfig, wl: Workload) -> dict[str, str]:
    """The scenario's cluster around the fleet (links, tiers or the scale-out's joins), and
    what it assumes, stated."""
    notes: dict[str, str] = {}
    blocks, engines = cfg.kv_capacity_blocks, cfg.engines
    if cfg.scenario == "slowlink":
        cfg.network_bytes_per_s = SLOW_NETWORK_BPS
        cfg.link_share_with_serving = 1.0
        notes["links"] = (
            "cross-node copies at 100 Gb/s, shared with serving traffic in proportion to load"
        )
    elif cfg.scenario == "tiered":
        gpu_blocks = max(8, int(blocks * TIERED_GPU_SHARE))
        cfg.kv_capacity_blocks = gpu_blocks
        cfg.tiers = (
            TierSpec(TIER_CPU, blocks * 4, CPU_TIER_BPS),
            TierSpec(TIER_DISK, blocks * 16, SSD_TIER_BPS),
        )
        notes["tiers"] = (
            f"HBM keeps {TIERED_GPU_SHARE:.0%} of the KV capacity for cached prefixes; "
            f"CPU DRAM 4x at {CPU_TIER_BPS / 1e9:.0f} GB/s, SSD 16x at "
            f"{SSD_TIER_BPS / 1e9:.0f} GB/s; evicted blocks are demoted a tier"
        )
    elif cfg.scenario == "scaleout":
        cfg.changes = tuple(scaleout_schedule(wl, engines))
        cfg.balance_wait_s = BALANCE_WAIT_S
        notes["scaleout"] = (
            f"{engines // 2} engines at start; the others join cold as the 5-minute "
            f"arrival rate reaches their share of the peak, announced {BOOT_S:.0f} s "
            "ahead (warming: they can receive copies, not traffic); for "
            f"{cfg.join_ramp_s:.0f} s after joining an engine takes any request "
            f"whose cache-aware choice queues > {BALANCE_WAIT_S} s longer than it"
        )
    else:
        notes["links"] = f"{STEADY_NETWORK_BPS / 1e9:.0f} GB/s network, NVLink inside a node"
    return notes


def _default_prefix_tokens(model: str) -> tuple[int, int]:
    # 70B-class tenants carry long documents (the case the issue sizes); 8B ones shorter prompts.
    return (8192, 131072) if "70b" in model else (2048, 32768)


def _servegen(
    path, scenario, engines, cost, start, duration, load, tenants, ptok, seed, clients
) -> Workload:
    duration = duration or 3600.0
    # A client half is a trace of its own: its ramp, its busiest tenants, and its rates scaled
    # to the same target load by the same rule as every client's.
    windows = sg.select_clients(sg.load_servegen_windows(path), clients)
    if start is None:
        start = sg.ramp_start(windows, duration)
    chosen = sg.top_tenants(path, tenants, start, duration, clients)
    rate = sg.mean_rate(chosen, start, duration)
    if rate <= 0:
        raise ValueError("no ServeGen traffic in the chosen window")
    # Calibrated at the window's busiest 5 minutes: the offered prefill work (every request
    # with its prefix cached, with the prefix lengths this seed draws) of the busiest 5-minute
    # stretch of expected rates puts ``load`` on the whole fleet (in ``scaleout`` every engine
    # serves by the peak). Calibrating on the mean ran a ramp window's second half far above
    # the target, and some seeds saturated.
    lengths = sg.prefix_lengths(list(chosen), ptok, seed)
    work = sg.peak_work_rate(
        chosen, start, duration, {n: cost.prefill_s(700, lengths[n]) for n in chosen}
    )
    if work <= 0:
        raise ValueError("no ServeGen traffic in the chosen window")
    scale = load * engines / work
    return sg.load_servegen(
        path,
        start=start,
        duration_s=duration,
        tenants=tenants,
        rate_scale=scale,
        prefix_tokens=ptok,
        seed=seed,
        clients=clients,
    )


def offered_load(cfg: ClusterConfig, wl: Workload, bin_s: float = 300.0) -> dict:
    """Offered prefill work (each request with its prefix cached) over the serving engines'
    capacity: the busiest ``bin_s`` stretch and the mean over the run (engines that join count
    from when they serve)."""
    if len(wl) == 0:
        return {"peak_5min": 0.0, "mean": 0.0}
    cost = cfg.cost
    ptok = np.array([len(p) * BLOCK_TOKENS for p in wl.prefixes], dtype=np.float64)[wl.pid]
    new = wl.suffix_tokens.astype(np.float64)
    f, m = cost.flops_per_s, cost.model
    work = cost.batch_overhead_s + new * (
        2.0 * m.params / f + 4.0 * m.layers * m.d_model / f * (ptok + 0.5 * new)
    )
    dur = max(wl.duration_s, float(wl.t[-1]))
    edges = np.arange(0.0, dur + bin_s, bin_s)
    per_bin, _ = np.histogram(wl.t, bins=edges, weights=work)
    mids = edges[:-1] + bin_s / 2
    serving = np.full(len(mids), float(cfg.engines))
    for ch in cfg.changes:
        serving -= (mids < ch.serve_s) | (mids >= ch.leave_s)
    span = np.minimum(edges[1:], dur) - edges[:-1]
    ok = span > 0
    loads = per_bin[ok] / (np.maximum(serving[ok], 1.0) * span[ok])
    total_capacity = float((np.maximum(serving[ok], 1.0) * span[ok]).sum())
    return {"peak_5min": float(loads.max()), "mean": float(per_bin.sum() / total_capacity)}


def scaleout_schedule(wl: Workload, engines: int, bin_s: float = 300.0) -> list[EngineChange]:
    """Half the engines serve from the start; engine k joins when demand reaches k/engines of
    the peak 5-minute rate (an autoscaler following the ramp), announced BOOT_S ahead."""
    first = engines // 2
    if len(wl) == 0:
        return []
    edges = np.arange(0.0, max(wl.duration_s, float(wl.t[-1])) + bin_s, bin_s)
    counts, _ = np.histogram(wl.t, bins=edges)
    rate = counts / bin_s
    peak = rate.max() if len(rate) else 0.0
    out = []
    for k in range(first, engines):
        need = peak * (k + 1) / engines
        idx = np.nonzero(rate >= need)[0]
        serve = float(edges[idx[0]]) if len(idx) else float(edges[-1])
        serve = max(serve, BOOT_S)
        out.append(EngineChange(k, announce_s=serve - BOOT_S, serve_s=serve))
    return out
