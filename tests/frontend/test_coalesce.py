"""Merging of realtime events: latest value per object, no object dropped, only what pages read."""

from controlplane.realtime.coalesce import Coalescer


def test_empty_drains_to_none():
    assert Coalescer().drain() is None


def test_merges_per_object_and_resets():
    c = Coalescer()
    c.add(
        "residency.delta",
        {"node": 1, "engines": {"3": {}}, "gpus": [{"uuid": "g", "memory_used": 1}], "at": 5.0},
    )
    c.add(
        "residency.delta",
        {"node": 2, "engines": {"4": {}}, "gpus": [{"uuid": "g", "memory_used": 2}], "at": 6.0},
    )
    c.add("job.update", {"job": "a", "state": "running"})
    c.add("job.progress", {"job_id": "a", "bytes_done": 10})
    c.add("plan.decided", {"plan": 9, "state": "approved"})
    out = c.drain()
    assert out == {
        "type": "delta",
        "events": 5,
        "at": 6.0,
        "residency": {"engines": [3, 4]},
        "jobs": [{"job": "a", "state": "running", "bytes_done": 10}],
        "plans": [{"plan": 9, "state": "approved"}],
    }
    assert c.drain() is None


def test_only_what_a_page_reads_is_sent():
    c = Coalescer()
    # No page reads these: a node gone stale, a forecast, readiness, GPU figures without residency
    # (the cache map reads GPU memory with its rows), a job's attempt or detail, a plan's mode.
    assert not c.add("node.stale", {"node": 2})
    assert not c.add("forecast.created", {"key": 7, "model": "ewma"})
    assert not c.add("engine.readiness", {"readiness": {"1": 0.5}})
    assert not c.add("residency.delta", {"node": 1, "engines": {}, "gpus": [{"uuid": "g"}]})
    assert c.drain() is None and not c.pending
    assert c.add(
        "job.update", {"job": "a", "state": "failed", "attempt": 2, "detail": "x", "error": "e"}
    )
    assert c.add("plan.created", {"plan": 3, "mode": "auto", "state": "proposed", "items": 4})
    assert c.drain() == {
        "type": "delta",
        "events": 2,
        "jobs": [{"job": "a", "state": "failed", "error": "e"}],
        "plans": [{"plan": 3, "state": "proposed"}],
    }
