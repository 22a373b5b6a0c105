"""Where a planned copy goes and where it comes from: targets kept in order of spare capacity,
sources by link, and when a copy's links free up."""

from __future__ import annotations

import bisect

from controlplane.core.policy.types import EngineState
from wire.protocol import ENGINE_WARMING


def link_wait(src: EngineState, dst: EngineState, queued: dict[str, float]) -> float:
    """Seconds before a copy from ``src`` to ``dst`` starts: copies queued on either link."""
    return max(
        src.link_queue_s + queued.get(src.engine_id, 0.0),
        dst.link_queue_s + queued.get(dst.engine_id, 0.0),
    )


def link_busy(
    src: EngineState,
    dst: EngineState,
    copy_s: float,
    horizon: float,
    queued: dict[str, float] | None = None,
) -> bool:
    """The copy would land more than half a horizon from now: its links are busy (with
    copies already queued, and ``queued`` seconds of this plan's own)."""
    q = queued or {}
    return (
        max(
            src.link_queue_s + q.get(src.engine_id, 0.0),
            dst.link_queue_s + q.get(dst.engine_id, 0.0),
        )
        + copy_s
        > 0.5 * horizon
    )


def target_key(eid: str, spare: dict[str, float], by_engine: dict) -> tuple:
    e = by_engine[eid]
    return (spare[eid], e.lifecycle == ENGINE_WARMING, e.link_bytes_per_s, eid)


class Targets:
    """The best target for each copy of a plan: the allowed engine with the most spare capacity
    (then warming, link, id) that does not hold the prefix and has room. Engines are kept sorted
    by that key, so a query walks down from the best and stops at the first engine that does
    not hold the prefix and has room (a fleet-size plan asks thousands of times over a thousand
    engines). Spare
    capacity and room only shrink during a plan: an engine with no spare left leaves the order."""

    def __init__(self, allowed, room: dict[str, float], spare: dict[str, float], by_engine):
        self.room, self.spare, self.by_engine = room, spare, by_engine
        self.order = sorted(target_key(eid, spare, by_engine) for eid in allowed if spare[eid] > 0)

    def best(self, nbytes: float, holders) -> str | None:
        room = self.room
        for key in reversed(self.order):
            eid = key[3]
            if eid not in holders and room[eid] >= nbytes:
                return eid
        return None

    def set_spare(self, eid: str, value: float) -> None:
        old = target_key(eid, self.spare, self.by_engine)
        i = bisect.bisect_left(self.order, old)
        if i < len(self.order) and self.order[i] == old:
            del self.order[i]
        self.spare[eid] = value
        if value > 0:
            bisect.insort(self.order, target_key(eid, self.spare, self.by_engine))


def best_source(holders, by_engine, target, queued: dict[str, float] | None = None) -> str:
    """Same node first (NVLink), then the link that frees up first, the fastest, the least
    loaded."""
    q = queued or {}

    def key(h):
        e = by_engine[h]
        return (
            e.node == target.node,
            -(e.link_queue_s + q.get(h, 0.0)),
            e.link_bytes_per_s,
            -e.load,
            h,
        )

    return max(holders, key=key)
