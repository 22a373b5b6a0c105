"""The policy's input rules, decided once: what an engine reports becomes the planner's
``EngineState`` here and nowhere else, so the simulator and the live control plane (each through
its own adapter) describe the same cluster the same way.

An adapter fills an ``EngineReport`` with what its engines report, as raw figures:

- ``waiting`` and ``running`` requests and the engine's ``slots`` (requests it serves at once):
  vLLM's ``num_requests_waiting`` / ``num_requests_running``; a simulated engine is a one-slot
  prefill server whose ``running`` is its recent utilisation (a time average of 0 or 1).
- ``request_s``: the prefill seconds of one of its requests (live: the mean request gateways
  recorded for the engine's model; simulated: the mean of its queued requests).
- ``link_bytes_queued``: bytes of copies in flight (queued or moving) on its link.
- ``free_bytes`` (room a speculative copy may take: free blocks and unreferenced cold ones) and
  ``displaced_s``: the expected prefill seconds the cached blocks in that room hold, from the
  residency the engine holds (``spec_room``; the simulator's cache applies the same rule block
  by block).

The rules (``engine_states``): queue = waiting x request_s; load = running / slots + queue /
horizon (at most 1; a joining engine: the serving engines' mean load x serving / (serving +
joining), the share it will take); link queue = bytes in flight / link bandwidth; displaced value
per byte = displaced seconds / room.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from controlplane.core.policy.types import EngineState
from wire.protocol import ENGINE_SERVING, ENGINE_WARMING

# Expected prefill seconds (over the horizon) below which cached room counts as free: the room a
# speculative copy may take (``spec_room``).
COLD_VALUE_S = 0.5


@dataclass(frozen=True, kw_only=True)
class EngineReport:
    """What one engine reports, before any rule is applied."""

    engine_id: str
    node: str
    lifecycle: str = ENGINE_SERVING
    kv_capacity_bytes: float
    free_bytes: float
    spec_bytes: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    slots: float = 1.0
    request_s: float = 0.0
    link_bytes_per_s: float
    link_bytes_queued: float = 0.0
    displaced_s: float = 0.0
    starts_serving_in_s: float = 0.0
    tier_bytes_per_s: dict[str, float] = field(default_factory=dict)


def estimate_queue_s(*, waiting: float, request_s: float) -> float:
    """Seconds until an engine frees up: its waiting requests times one request's prefill."""
    return max(0.0, waiting) * max(0.0, request_s)


def engine_load(*, running: float, slots: float, queue_s: float, horizon_s: float) -> float:
    """Compute load (0..1): the share of its slots running, plus its queue over the horizon."""
    busy = max(0.0, running) / slots if slots > 0 else 1.0
    return min(1.0, busy + queue_s / horizon_s)


def estimate_link_queue_s(*, bytes_queued: float, link_bytes_per_s: float) -> float:
    """Seconds before a new copy on this link starts: the bytes of copies already on it."""
    return max(0.0, bytes_queued) / max(1.0, link_bytes_per_s)


def spec_room(*, free_bytes: float, cached: Iterable, cold_value_s: float) -> tuple[float, float]:
    """Room a speculative copy may take, and the expected prefill seconds it holds: free bytes,
    then unreferenced cached blocks ``(nbytes, value_s)`` cheapest per byte first while their
    value stays under ``cold_value_s`` in all (the blocks the engine's own eviction would take
    first). Referenced blocks (running or waiting requests use them) are not passed in."""
    room, held = max(0.0, free_bytes), 0.0
    for nbytes, value in sorted(cached, key=lambda r: r[1] / r[0] if r[0] else 0.0):
        v = max(value, 0.0)
        if held + v >= cold_value_s and value > 0:
            break
        held += v
        room += nbytes
    return room, held


def engine_state(report: EngineReport, *, horizon_s: float, joining_load: float) -> EngineState:
    """The planner's view of one engine, by the rules in the module doc (``joining_load``: the
    load a joining engine will take, from ``engine_states``)."""
    serving = report.lifecycle == ENGINE_SERVING
    queue = estimate_queue_s(waiting=report.waiting, request_s=report.request_s) if serving else 0.0
    if serving:
        load = engine_load(
            running=report.running, slots=report.slots, queue_s=queue, horizon_s=horizon_s
        )
    else:
        load = joining_load
    room = max(0.0, report.free_bytes)
    return EngineState(
        engine_id=report.engine_id,
        node=report.node,
        kv_capacity_bytes=float(report.kv_capacity_bytes),
        free_bytes=room,
        spec_bytes=float(report.spec_bytes),
        link_bytes_per_s=float(report.link_bytes_per_s),
        load=load,
        lifecycle=report.lifecycle,
        starts_serving_in_s=max(0.0, report.starts_serving_in_s),
        tier_bytes_per_s=dict(report.tier_bytes_per_s),
        link_queue_s=estimate_link_queue_s(
            bytes_queued=report.link_bytes_queued, link_bytes_per_s=report.link_bytes_per_s
        ),
        queue_s=queue,
        displaced_s_per_byte=report.displaced_s / room if room > 0 else 0.0,
    )


def engine_states(reports: Iterable[EngineReport], *, horizon_s: float) -> list[EngineState]:
    """Every engine's view. A joining engine will take its share of the serving engines' load:
    their mean load x serving / (serving + joining)."""
    reports = list(reports)
    serving = [r for r in reports if r.lifecycle == ENGINE_SERVING]
    joining = sum(1 for r in reports if r.lifecycle == ENGINE_WARMING)
    busy = [
        engine_load(
            running=r.running,
            slots=r.slots,
            queue_s=estimate_queue_s(waiting=r.waiting, request_s=r.request_s),
            horizon_s=horizon_s,
        )
        for r in serving
    ]
    mean = sum(busy) / len(busy) if busy else 0.0
    share = mean * len(serving) / max(1, len(serving) + joining)
    return [engine_state(r, horizon_s=horizon_s, joining_load=share) for r in reports]
