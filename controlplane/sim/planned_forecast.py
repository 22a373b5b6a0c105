"""``predictive``'s forecast of each prefix's demand (``planned.PlannedPolicy``): per prefix the
recent rate (a rising one extrapolated over the horizon, a burst's onset as the rate now),
blended with the ramp of the same windows a day earlier and with the day-scale forecast of its
key where that beats the naive one; while engines join a scale-out, also the prefixes with no
recent traffic but a forecast level for the coming window. Each forecast rate becomes a demand
through the shared demand model (``core.demand``), its burst risk against the holders' capacity.

The functions read the policy's trackers (``policy``: a ``PlannedPolicy`` after ``setup``).
"""

from __future__ import annotations

from typing import Any

from controlplane.core.demand import burst_probability, demand_for
from controlplane.core.forecast.burst import BurstTracker
from controlplane.core.policy.types import Demand
from controlplane.sim.engine import WARMING
from controlplane.sim.planned_demand import DAY_BUCKETS, MAX_CANDIDATES
from controlplane.sim.workloads.base import BLOCK_TOKENS

# (forecast rate, prefix, its tracker (None: no recent traffic), its forecast's backtest MASE)
Row = tuple[float, int, BurstTracker | None, float | None]


def predicted(policy: Any, sim, t: float, H: float, only=None) -> dict[int, Demand]:
    """The forecast demand of every tracked prefix (``only``: of these), best first."""
    rows = [
        r
        for pid in (policy.trackers if only is None else only)
        if (r := _row(policy, sim, t, H, pid))
    ]
    if only is None and any(e.state == WARMING for e in sim.engines):
        rows += _warming_rows(policy, sim, t, H, {pid for _, pid, _, _ in rows})
    rows.sort(key=lambda x: (-x[0], x[1]))
    return {
        pid: _demand(policy, sim, t, H, row) for row in rows[:MAX_CANDIDATES] for pid in (row[1],)
    }


def _row(policy: Any, sim, t: float, H: float, pid: int) -> Row | None:
    """The prefix's forecast rate over the horizon, or None without signal yet (the reactive
    rule covers it)."""
    tr = policy.trackers[pid]
    if policy.seen.get(pid, 0) < 3:
        return None
    r = tr.rate(t)
    if r <= 0:
        return None
    # A rising rate (the short window above the long one) is extrapolated over the horizon: a
    # ramp is planned for while it builds, not once the 2-minute rate shows it.
    rs = policy.short[pid].rate(t)
    if rs > r:
        r = rs + (rs - r)
    # A burst's onset: the last seconds' rate, when it is one, is the rate now.
    r = max(r, policy._onset_rate(pid, t))
    wl = sim.workload
    key = wl.prefix_wkey[pid]
    lam = r
    hist = wl.history.get(key)
    if hist is not None and len(hist) >= DAY_BUCKETS:
        b0 = len(hist) - DAY_BUCKETS + int(t // wl.history_bucket_s)
        b1 = len(hist) - DAY_BUCKETS + int((t + H) // wl.history_bucket_s)
        if 0 <= b0 and b1 < len(hist) and hist[b0] > 0:
            ratio = min(3.0, max(0.5, hist[b1] / hist[b0]))
            lam = r * (0.5 + 0.5 * ratio)  # recent rate blended with yesterday's ramp
    day = policy.day.get(key)
    mase = policy.day_mase.get(key)
    if day is not None and mase is not None and mase < 1.0:
        lam = 0.75 * lam + 0.25 * _level(day, wl, t, H)
    else:
        # No day-scale forecast better than the naive one: the recent rate is the naive
        # (last-value) forecast, whose MASE is 1 by definition.
        mase = 1.0
    return (lam, pid, tr, mase)


def _level(day, wl, t: float, H: float) -> float:
    """The day-scale forecast's rate at the middle of the coming horizon."""
    b = min(len(day) - 1, int((t + H / 2) // wl.history_bucket_s))
    return max(0.0, float(day[b])) / wl.history_bucket_s


def _warming_rows(policy: Any, sim, t: float, H: float, have: set[int]) -> list[Row]:
    """Engines joining a scale-out are warmed from the day-scale forecast too: a prefix with no
    recent traffic yet but a forecast level for the coming window."""
    wl = sim.workload
    rows: list[Row] = []
    for pid, key in enumerate(wl.prefix_wkey):
        day = policy.day.get(key)
        if pid in have or day is None:
            continue
        level = _level(day, wl, t, H)
        if level > 0:
            rows.append((level, pid, None, policy.day_mase.get(key)))
    return rows


def _demand(policy: Any, sim, t: float, H: float, row: Row) -> Demand:
    """The row's demand: burst risk against the holders' capacity (the shared demand model,
    ``core.demand``), over the horizon plus the time a copy would take now: a copy that is slow
    on a busy link must start ahead of a burst that a fast one could follow."""
    lam, pid, tracker, mase = row
    wl, load, cfg = sim.workload, sim.load(t), sim.config
    link = cfg.network_bytes_per_s * max(0.05, 1.0 - cfg.link_share_with_serving * load)
    keys = wl.prefixes[pid]
    service = sim.prefill_s(policy.mean_suffix, len(keys) * BLOCK_TOKENS)
    holders = sum(1 for e in sim.serving if e.cache.match(keys) == len(keys))
    cap = max(1, holders) * (1.0 - load) / service
    risk, recent = 0.0, 0.0
    if tracker is not None and tracker.exposure(t) > 0:
        recent = max(tracker.rate(t), policy.short[pid].rate(t), policy._onset_rate(pid, t))
        lead = H + len(keys) * sim.block_bytes / link
        risk = burst_probability(
            recent, tracker.cv(t), lead, tracker.exposure(t), capacity_rate=cap
        )
    policy.forecast_log.setdefault(wl.prefix_wkey[pid], []).append((t, lam))
    return demand_for(
        str(pid),
        expected_requests=lam * H,
        horizon_s=H,
        burst_probability=risk,
        recent_rate=recent,
        backtest_mase=mase,
    )
