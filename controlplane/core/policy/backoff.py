"""The back-off: while the serving engines queue, speculation holds back (warm-ups of joining
engines, and copies of a prefix whose own holders carry the queue, go on). The planner applies
it; the plan summary reports it (``queue_gate``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from controlplane.core.policy.types import Budgets, EngineState
from wire.protocol import ENGINE_SERVING


def cluster_queue_s(engines: Iterable[EngineState]) -> float:
    """Mean queue (seconds) of the serving engines: what the planner backs off on."""
    qs = [e.queue_s for e in engines if e.lifecycle == ENGINE_SERVING]
    return sum(qs) / len(qs) if qs else 0.0


def backs_off(engines: Iterable[EngineState], budgets: Budgets) -> bool:
    """The serving engines queue more than ``max_cluster_queue_s`` on average: no speculative
    item but warm-ups of joining engines and the copies ``backs_off_around`` lets through."""
    return backs_off_around(engines, budgets, ())


def backs_off_around(
    engines: Iterable[EngineState], budgets: Budgets, holders: Iterable[str]
) -> bool:
    """The back-off for one prefix: the serving engines that do not hold it queue more than
    ``max_cluster_queue_s`` on average. Its holders' queue is left out: where that is its own
    burst, a replica elsewhere is what relieves it."""
    held = set(holders)
    return cluster_queue_s(e for e in engines if e.engine_id not in held) > (
        budgets.max_cluster_queue_s
    )


def queue_gate(engines: Sequence[EngineState], budgets: Budgets) -> dict:
    """What the queues held back in a plan, for its summary: the serving engines' mean queue
    against ``max_cluster_queue_s`` (the back-off) and the engines over ``max_queue_s`` (no item
    lands there), with a sentence saying so. Limits that are off (infinite) read None."""
    q = cluster_queue_s(engines)
    over = sorted(
        e.engine_id
        for e in engines
        if e.lifecycle == ENGINE_SERVING and e.queue_s > budgets.max_queue_s
    )
    backoff = backs_off(engines, budgets)
    if backoff:
        why = (
            f"serving engines queue {q:.2f} s on average (limit {budgets.max_cluster_queue_s:g} "
            "s): speculative copies and promotions held back, but warm-ups of joining engines "
            "and copies of a prefix whose holders carry the queue (the engines that do not "
            "hold it queue under the limit)"
        )
    elif over:
        why = (
            f"{len(over)} serving engine(s) queue over {budgets.max_queue_s:g} s: "
            "no speculative item lands there"
        )
    else:
        why = ""
    return {
        "cluster_queue_s": round(q, 4),
        "max_cluster_queue_s": _finite(budgets.max_cluster_queue_s),
        "max_queue_s": _finite(budgets.max_queue_s),
        "backed_off": backoff,
        "engines_over_max_queue": over,
        "why": why,
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
