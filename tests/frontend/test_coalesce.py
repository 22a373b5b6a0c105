"""Merging of realtime events: latest value per object, no object dropped, only what pages read."""

from controlplane.realtime import events
from controlplane.realtime.coalesce import Coalescer


def add(c: Coalescer, event: events.Event) -> bool:
    return c.add(event.name, event.payload)


def test_empty_drains_to_none():
    assert Coalescer().drain() is None


def test_merges_per_object_and_resets():
    c = Coalescer()
    add(c, events.residency_delta(1, {"3": {}}, [{"uuid": "g", "memory_used": 1}], 5.0))
    add(c, events.residency_delta(2, {"4": {}}, [{"uuid": "g", "memory_used": 2}], 6.0))
    add(c, events.job_update("a", "running", 1, 0, ""))
    add(c, events.job_update("a", "running", 1, 10, ""))
    add(c, events.plan_decided(9, "approved"))
    out = c.drain()
    assert out == {
        "type": "delta",
        "events": 5,
        "at": 6.0,
        "residency": {"engines": [3, 4]},
        "jobs": [{"job_id": "a", "state": "running", "bytes_done": 10, "error": ""}],
        "plans": [{"plan_id": 9, "state": "approved"}],
    }
    assert c.drain() is None


def test_only_what_a_page_reads_is_sent():
    c = Coalescer()
    # No page reads these: a node gone stale, a forecast, readiness, GPU figures without residency
    # (the cache map reads GPU memory with its rows), a job's attempt or detail, a plan's mode.
    assert not add(c, events.node_stale(2))
    assert not c.add("forecast.created", {"key": 7, "model": "ewma"})
    assert not add(c, events.engine_readiness({"1": 0.5}))
    assert not add(c, events.residency_delta(1, {}, [{"uuid": "g"}], 1.0))
    assert c.drain() is None and not c.pending
    assert add(c, events.job_update("a", "failed", 2, 0, "e", detail="x"))
    assert add(c, events.plan_created(3, "auto", "proposed", 4))
    assert c.drain() == {
        "type": "delta",
        "events": 2,
        "jobs": [{"job_id": "a", "state": "failed", "bytes_done": 0, "error": "e"}],
        "plans": [{"plan_id": 3, "state": "proposed"}],
    }
