"""The dashboard's realtime events, typed like the agent's messages (``wire/protocol.py``).

One constructor per event type; each returns an ``Event`` (its group, its name, its payload) whose
payload carries exactly the keys ``FIELDS`` lists for that name, no more and no fewer. Keys are
spelled as the wire spells the same concept: a job is ``job_id`` (as in ``job.ack``), an engine
``engine_id``, a node ``node_id``, a plan ``plan_id``. Services build events here and send them
with ``realtime.publish.publish_event``; ``realtime.coalesce`` merges them for browsers.

Pure (no Django), like the protocol module it mirrors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from wire import protocol

from . import groups

FIELDS: dict[str, tuple[str, ...]] = {
    # engines: engine id (str) -> {"stored", "removed", "mode"}; gpus: [{"uuid", "memory_used",
    # "memory_total"}]; at: when the report was applied (epoch seconds)
    protocol.EVENT_RESIDENCY_DELTA: ("node_id", "engines", "gpus", "at"),
    protocol.EVENT_NODE_STALE: ("node_id",),
    protocol.EVENT_ENGINE_READINESS: ("readiness",),  # engine id (str) -> fraction held
    protocol.EVENT_PLAN_CREATED: ("plan_id", "mode", "state", "items"),  # items: how many
    protocol.EVENT_PLAN_DECIDED: ("plan_id", "state"),
    # The job's whole live state each time (a later event replaces an earlier one); detail: why
    # it reached this state ("" when nothing was said).
    protocol.EVENT_JOB_UPDATE: ("job_id", "state", "attempt", "bytes_done", "error", "detail"),
}


class EventShapeError(ValueError):
    """A payload whose keys are not its event's ``FIELDS``."""


class Event(NamedTuple):
    group: str  # a dashboard group (realtime/groups.py)
    name: str  # the event type, e.g. ``job.update``
    payload: dict[str, Any]


def check(name: str, payload: dict[str, Any]) -> None:
    """Raise ``EventShapeError`` unless ``payload`` has exactly the keys of event ``name``."""
    if name not in FIELDS:
        raise EventShapeError(f"{name!r} is not a dashboard event")
    missing = [k for k in FIELDS[name] if k not in payload]
    extra = sorted(set(payload) - set(FIELDS[name]))
    if missing or extra:
        raise EventShapeError(f"{name}: missing {missing}, unexpected {extra}")


def _event(group: str, name: str, payload: dict[str, Any]) -> Event:
    check(name, payload)
    return Event(group, name, payload)


def residency_delta(
    node_id: int, engines: dict[str, dict[str, Any]], gpus: list[dict[str, Any]], at: float
) -> Event:
    payload = {"node_id": node_id, "engines": engines, "gpus": gpus, "at": at}
    return _event(groups.CLUSTER, protocol.EVENT_RESIDENCY_DELTA, payload)


def node_stale(node_id: int) -> Event:
    return _event(groups.CLUSTER, protocol.EVENT_NODE_STALE, {"node_id": node_id})


def engine_readiness(readiness: dict[str, float]) -> Event:
    return _event(groups.CLUSTER, protocol.EVENT_ENGINE_READINESS, {"readiness": readiness})


def plan_created(plan_id: int, mode: str, state: str, items: int) -> Event:
    payload = {"plan_id": plan_id, "mode": mode, "state": state, "items": items}
    return _event(groups.PLANS, protocol.EVENT_PLAN_CREATED, payload)


def plan_decided(plan_id: int, state: str) -> Event:
    return _event(groups.PLANS, protocol.EVENT_PLAN_DECIDED, {"plan_id": plan_id, "state": state})


def job_update(
    job_id: str, state: str, attempt: int, bytes_done: int, error: str, detail: str = ""
) -> Event:
    payload = {
        "job_id": job_id,
        "state": state,
        "attempt": attempt,
        "bytes_done": bytes_done,
        "error": error,
        "detail": detail[:200],
    }
    return _event(groups.JOBS, protocol.EVENT_JOB_UPDATE, payload)
