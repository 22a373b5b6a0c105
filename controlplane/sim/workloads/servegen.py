"""ServeGen per-tenant windows turned into arrivals, each tenant with its own shared prefix.

Windows come from ``controlplane.core.traces.servegen.load_servegen_windows`` (10-minute rows of
rate, inter-arrival CV and a Gamma/Weibull fit). Arrivals of a window are a renewal process with
the window's *rate* and the fitted distribution's *shape* (which fixes the CV, hence the
burstiness); the fitted scale is rescaled so the mean inter-arrival time is 1 / rate (the
published scales do not reproduce the published rates). Rates are multiplied by ``rate_scale``
(chosen by the caller to put the cluster at a target load).

Prefixes (stated in every report): each tenant has one shared prefix (system prompt, tool
descriptions, documents) whose length is drawn log-uniformly in ``prefix_tokens`` per tenant from
a seeded generator; keys come from ``chain_keys`` over deterministic synthetic token ids of the
tenant. Each request appends its own prompt (log-normal, median 600 tokens, sigma 0.8, at most
8k) and generates a log-normal output (median 250 tokens). The workload key is the tenant.
``history`` holds each tenant's expected counts per window before the start, scaled the same way:
the past a forecaster may use.

Client halves (``clients``): ``tune`` and ``holdout`` split a category's clients in two by client
name, never by file order: clients sorted by the SHA-256 of their name, the first half (rounded
down) ``tune``, the rest ``holdout``. The split depends only on the set of names, so it is the
same on every run and machine; parameters are tuned on ``tune`` and reported on both. A half is a
category of its own: the window, the busiest tenants and the rate scaling are chosen from its
clients alone, by the same rules as for ``all``.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np

from controlplane.core.traces.servegen import ServegenTenant, load_servegen_windows
from controlplane.sim.workloads.azure import synthetic_prefix
from controlplane.sim.workloads.base import Workload

DAY_S = 86400.0
CLIENT_HALVES = ("all", "tune", "holdout")


def client_halves(names) -> dict[str, tuple[str, ...]]:
    """``{"tune": ..., "holdout": ...}``: the clients sorted by the SHA-256 of their name, split
    in the middle (``tune`` gets the smaller half of an odd count); each half in that order."""
    order = sorted(set(names), key=lambda n: (hashlib.sha256(n.encode()).hexdigest(), n))
    cut = len(order) // 2
    return {"tune": tuple(order[:cut]), "holdout": tuple(order[cut:])}


def select_clients(
    tenants: dict[str, ServegenTenant], clients: str = "all"
) -> dict[str, ServegenTenant]:
    """The tenants of one half (``client_halves``), or all of them."""
    if clients not in CLIENT_HALVES:
        raise ValueError(f"clients must be one of {', '.join(CLIENT_HALVES)}, not {clients!r}")
    if clients == "all":
        return tenants
    keep = set(client_halves(tenants)[clients])
    return {n: t for n, t in tenants.items() if n in keep}


def aggregate_rate(tenants: dict[str, ServegenTenant]) -> tuple[np.ndarray, np.ndarray]:
    """Window starts and the summed rate of all tenants."""
    first = next(iter(tenants.values()))
    total = np.zeros(len(first))
    for ten in tenants.values():
        n = min(len(total), len(ten))
        total[:n] += ten.rate[:n]
    return first.window_start_s, total


def ramp_start(
    tenants: dict[str, ServegenTenant], duration_s: float, min_history_s: float = DAY_S
) -> float:
    """Start of the window with the largest demand ramp over ``duration_s`` (after a day of
    history, so day-earlier forecasts have something to go on)."""
    starts, total = aggregate_rate(tenants)
    w = starts[1] - starts[0] if len(starts) > 1 else 600.0
    span = max(1, int(round(duration_s / w)))
    best, best_t = -np.inf, float(starts[0])
    for i in range(len(starts) - span):
        if starts[i] < starts[0] + min_history_s or total[i] <= 0:
            continue
        gain = total[i + span] / total[i]
        if gain > best:
            best, best_t = gain, float(starts[i])
    return best_t


def mean_rate(tenants: dict[str, ServegenTenant], start: float, duration_s: float) -> float:
    starts, total = aggregate_rate(tenants)
    sel = (starts >= start) & (starts < start + duration_s)
    return float(total[sel].mean()) if sel.any() else 0.0


def peak_work_rate(
    tenants: dict[str, ServegenTenant],
    start: float,
    duration_s: float,
    service_s: dict[str, float],
    bin_s: float = 300.0,
) -> float:
    """Highest expected prefill work per second (sum over tenants of rate x service time) over
    the ``bin_s`` stretches of ``[start, start + duration_s)`` (window rates are step functions)."""
    edges = np.arange(start, start + duration_s, bin_s)
    best = 0.0
    for a in edges:
        b = min(a + bin_s, start + duration_s)
        work = 0.0
        for name, ten in tenants.items():
            W = ten.window_s
            lo, hi = ten.window_start_s, ten.window_start_s + W
            overlap = np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0.0, None)
            work += float((ten.rate * overlap).sum()) / (b - a) * service_s[name]
        best = max(best, work)
    return best


def _draw_lengths(rng, n: int, lo: int, hi: int) -> np.ndarray:
    return np.exp(rng.uniform(math.log(lo), math.log(hi), size=n)).astype(int)


def prefix_lengths(names: list[str], prefix_tokens: tuple[int, int], seed: int) -> dict[str, int]:
    """The prefix length each tenant gets in ``load_servegen`` for this seed (same draw)."""
    lo, hi = prefix_tokens
    lengths = _draw_lengths(np.random.default_rng(seed), len(names), lo, hi)
    return {name: int(x) for name, x in zip(names, lengths, strict=True)}


def top_tenants(
    path: str | Path | None, count: int, start: float, duration_s: float, clients: str = "all"
) -> dict[str, ServegenTenant]:
    """The ``count`` busiest tenants of ``[start, start + duration_s)`` among ``clients``."""
    tenants = select_clients(load_servegen_windows(path), clients)
    vol = {}
    for name, ten in tenants.items():
        sel = (ten.window_start_s >= start) & (ten.window_start_s < start + duration_s)
        vol[name] = float(ten.rate[sel].sum())
    keep = sorted(vol, key=lambda n: (-vol[n], n))[:count]
    return {n: tenants[n] for n in sorted(keep)}


def load_servegen(
    path: str | Path | None = None,
    *,
    start: float,
    duration_s: float,
    tenants: int = 30,
    rate_scale: float = 1.0,
    prefix_tokens: tuple[int, int] = (2048, 32768),
    seed: int = 0,
    clients: str = "all",
) -> Workload:
    if duration_s <= 0 or rate_scale <= 0:
        raise ValueError("duration and rate scale must be > 0")
    lo, hi = prefix_tokens
    if not 0 < lo <= hi:
        raise ValueError("prefix token range must satisfy 0 < low <= high")
    chosen = top_tenants(path, tenants, start, duration_s, clients)
    if not chosen:
        raise ValueError("no ServeGen tenants found")
    rng = np.random.default_rng(seed)
    names = list(chosen)
    lengths = _draw_lengths(rng, len(names), lo, hi)
    prefixes = [synthetic_prefix(10_000 + j, int(lengths[j])) for j in range(len(names))]
    times: list[np.ndarray] = []
    pids: list[np.ndarray] = []
    history: dict[str, np.ndarray] = {}
    for j, name in enumerate(names):
        ten = chosen[name]
        W = ten.window_s
        before = ten.window_start_s < start
        history[name] = ten.expected_counts()[before] * rate_scale
        sel = np.nonzero(
            (ten.window_start_s + W > start) & (ten.window_start_s < start + duration_s)
        )[0]
        for w in sel:
            r = ten.rate[w] * rate_scale
            if r <= 0 or ten.pattern[w] == "":
                continue
            arr = _window_arrivals(
                rng, float(ten.window_start_s[w]), W, r, ten.pattern[w], float(ten.shape[w])
            )
            arr = arr[(arr >= start) & (arr < start + duration_s)]
            times.append(arr - start)
            pids.append(np.full(len(arr), j, dtype=np.int32))
    t = np.concatenate(times) if times else np.zeros(0)
    pid = np.concatenate(pids) if pids else np.zeros(0, dtype=np.int32)
    order = np.argsort(t, kind="stable")
    n = len(t)
    suffix = np.minimum(8192, rng.lognormal(math.log(600), 0.8, size=n)).astype(np.int32)
    out = np.minimum(4096, rng.lognormal(math.log(250), 0.8, size=n)).astype(np.int32)
    workload = Workload(
        "servegen",
        t[order],
        pid[order],
        suffix,
        out,
        prefixes,
        names,
        history=history,
        history_bucket_s=600.0,
        duration_s=duration_s,
    )
    workload.assumptions.update(
        {
            "source": "ServeGen m-large per-tenant 10-minute windows (Alibaba Cloud Model Studio)",
            "window": f"start {start:.0f} s into the trace (day {start / DAY_S:.2f}), {duration_s:.0f} s",
            "tenants": f"the {len(names)} busiest tenants of the window",
            "clients": CLIENTS_NOTE[clients],
            "arrivals": "renewal process per window: window rate x rate_scale, fitted Gamma/Weibull shape, "
            "scale rescaled to mean 1/rate",
            "rate_scale": f"{rate_scale:.4g}",
            "prefix": f"one shared prefix per tenant, log-uniform {lo}-{hi} tokens (seed {seed}); "
            "keys = chain_keys over synthetic token ids",
            "request": "own prompt log-normal median 600 tokens (sigma 0.8, <= 8k); output median 250",
        }
    )
    return workload


CLIENTS_NOTE = {
    "all": "every client of the trace",
    "tune": "the tune half of the clients (SHA-256 of the client name, lower half)",
    "holdout": "the holdout half of the clients (SHA-256 of the client name, upper half)",
}


def _window_arrivals(
    rng, w0: float, W: float, rate: float, pattern: str, shape: float
) -> np.ndarray:
    n = rate * W
    draws = int(n * 1.5 + 8 * math.sqrt(n) + 16)
    if pattern == "Weibull" and shape > 0:
        scale = 1.0 / (rate * math.gamma(1.0 + 1.0 / shape))
        ia = scale * rng.weibull(shape, size=draws)
    elif pattern == "Gamma" and shape > 0:
        ia = rng.gamma(shape, 1.0 / (rate * shape), size=draws)
    else:
        ia = rng.exponential(1.0 / rate, size=draws)
    # Start at a random phase of the first gap so windows do not all begin with an arrival.
    t = w0 + np.cumsum(ia) - ia[0] * rng.uniform()
    return t[t < w0 + W]
