"""Merging of realtime events: latest value per object, no object dropped."""

from controlplane.realtime.coalesce import Coalescer


def test_empty_drains_to_none():
    assert Coalescer().drain() is None


def test_merges_per_object_and_resets():
    c = Coalescer()
    c.add("residency.delta", {"node": 1, "engines": {"3": {}}, "gpus": [{"uuid": "g", "memory_used": 1}], "at": 5.0})
    c.add("residency.delta", {"node": 2, "engines": {"4": {}}, "gpus": [{"uuid": "g", "memory_used": 2}], "at": 6.0})
    c.add("job.update", {"job": "a", "state": "running"})
    c.add("job.progress", {"job_id": "a", "bytes_done": 10})
    c.add("plan.decided", {"plan": 9, "state": "approved"})
    c.add("node.stale", {"node": 2})
    out = c.drain()
    assert out["events"] == 6 and out["at"] == 6.0
    assert out["residency"] == {"engines": [3, 4], "nodes": [1, 2], "gpus": [{"uuid": "g", "memory_used": 2}]}
    assert out["jobs"] == [{"job": "a", "state": "running", "job_id": "a", "bytes_done": 10}]
    assert out["plans"] == [{"plan": 9, "state": "approved", "event": "plan.decided"}]
    assert out["stale_nodes"] == [2]
    assert c.drain() is None
