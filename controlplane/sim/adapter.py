"""The simulator's adapter to the shared policy (``controlplane.core.policy``): its engines and
residency described as the live control plane describes a real fleet's, so the input rules in
``core.policy.inputs`` apply to both.

What a simulated engine reports: its waiting requests (a FIFO prefill server: every request
behind the one running) and the mean prefill of those, its recent utilisation as ``running`` of
one slot (the time average of a one-request server), the bytes still to cross its link, and its
room with the expected value the room holds (its cache ranks unreferenced blocks by the
policy's value function, cheapest first: ``core.policy.inputs.spec_room`` block by block).
"""

from __future__ import annotations

from controlplane.core.policy.inputs import EngineReport
from controlplane.core.policy.types import Candidate, Holding
from controlplane.sim.engine import GONE, PLANNED, SERVING, WARMING
from controlplane.sim.workloads.base import BLOCK_TOKENS
from wire.protocol import ENGINE_SERVING, ENGINE_WARMING, TIER_GPU


def waiting_requests(e, t: float) -> tuple[int, float]:
    """(requests waiting on ``e`` at ``t``, the mean prefill seconds of one of them)."""
    e.refresh_busy(t)
    q = e.queue
    if len(q) <= 1:  # the first unfinished request is the one running
        return 0, 0.0
    waiting = len(q) - 1
    return waiting, max(0.0, e.free_at - q[0][1]) / waiting


def engine_reports(sim, t: float, value_of, *, cold_value_s: float) -> list[EngineReport]:
    """Every serving or joining engine of ``sim`` at ``t``, as its report."""
    bb = sim.block_bytes
    load = sim.load(t)
    cfg = sim.config
    link = cfg.network_bytes_per_s * max(0.05, 1.0 - cfg.link_share_with_serving * load)
    out = []
    for e in sim.engines:
        if e.state not in (SERVING, WARMING):
            continue
        c = e.cache
        waiting, request_s = waiting_requests(e, t)
        # Room: free blocks, and unreferenced blocks the ranking counts as cold; and what that
        # room holds: the expected value of the blocks it would displace.
        room = c.spec_room(value_of, cold_value_s)
        _, displaced = c.displaceable(room, value_of)
        out.append(
            EngineReport(
                engine_id=e.name,
                node=f"n{e.node}",
                lifecycle=ENGINE_SERVING if e.state == SERVING else ENGINE_WARMING,
                kv_capacity_bytes=c.capacity * bb,
                free_bytes=room * bb,
                spec_bytes=len(c.spec) * bb,
                waiting=waiting,
                running=load,
                slots=1.0,
                request_s=request_s,
                link_bytes_per_s=link,
                link_bytes_queued=max(0.0, e.link_free_at - t) * link,
                displaced_s=displaced,
                starts_serving_in_s=0.0 if e.state == SERVING else _serve_time(sim, e) - t,
                tier_bytes_per_s={tier.name: tier.bytes_per_s for tier in e.tiers},
            )
        )
    return out


def candidates(sim, pids, min_blocks: int, mean_suffix: float) -> list[Candidate]:
    """The prefixes ``pids`` at least ``min_blocks`` long, as the planner's candidates: their
    bytes, and the prefill of a mean request with the prefix cached and without it."""
    wl, bb = sim.workload, sim.block_bytes
    out = []
    for pid in pids:
        keys = wl.prefixes[pid]
        if len(keys) < min_blocks:
            continue
        tokens = len(keys) * BLOCK_TOKENS
        service = sim.prefill_s(mean_suffix, tokens)
        recompute = sim.prefill_s(mean_suffix + tokens, 0.0) - service
        out.append(
            Candidate(
                str(pid), keys, tokens, len(keys) * bb, wl.prefix_wkey[pid], service, recompute
            )
        )
    return out


def holdings(sim, cands, t: float) -> list[Holding]:
    """Engines holding each candidate's whole chain in HBM (or landing there by ``t``), or on
    a lower tier below what HBM holds."""
    rows = []
    for c in cands:
        n = len(c.keys)
        for e in sim.engines:
            if e.state in (GONE, PLANNED):
                continue
            m, lower = e.match(c.keys, t)
            if m == n:
                rows.append(Holding(c.prefix_id, e.name, TIER_GPU))
            elif lower and m + sum(k for _, k in lower) == n:
                rows.append(Holding(c.prefix_id, e.name, lower[-1][0].name))
    return rows


def _serve_time(sim, e) -> float:
    for ch in sim.config.changes:
        if ch.eid == e.eid:
            return ch.serve_s
    return 0.0
