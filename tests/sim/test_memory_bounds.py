"""What the virtual cluster's processes hold while the control plane falls behind is bounded."""

import httpx
import pytest

from harness import gateway
from harness.cli import start_memory_upkeep
from harness.gateway import MAX_BACKLOG_BYTES, RecordPoster, weight
from nodeagent import memtrim


def poster(status: list[int]) -> RecordPoster:
    """A poster whose control plane answers with ``status[0]`` (changeable by the test)."""
    client = httpx.Client(transport=httpx.MockTransport(lambda req: httpx.Response(status[0])))
    return RecordPoster("http://cp", "pwg_token", client=client)


def test_the_backlog_is_bounded_in_bytes_and_keeps_the_newest():
    status = [503]
    p = poster(status)
    keys = ["0123456789abcdef"] * 6_900  # a 110k-token prompt's keys, as the demo's are
    records = [{"time": 1.0 + i, "model": "m", "tenant": "t", "keys": keys} for i in range(300)]
    for rec in records:
        p.add(rec)
    assert not p.flush()  # the control plane does not take them
    # 300 such records weigh ~150 MB: only the newest that fit in the bound wait.
    assert p.pending_bytes <= MAX_BACKLOG_BYTES
    assert p.pending == MAX_BACKLOG_BYTES // weight(records[0])
    assert p.dropped == 300 - p.pending
    assert p._pending[-1] is records[-1] and p._pending[0] is records[300 - p.pending]
    status[0] = 200
    for _ in range(10):  # each flush sends a few byte-bounded batches
        if p.flush() and not p.pending:
            break
    assert (p.pending, p.pending_bytes, p.posted) == (0, 0, 300 - p.dropped)


def test_a_record_over_the_bound_alone_is_still_sent(monkeypatch):
    monkeypatch.setattr(gateway, "MAX_BACKLOG_BYTES", 1000)
    p = poster([503])
    big = {"time": 1.0, "model": "m", "tenant": "t", "token_ids": list(range(100))}
    p.add({"time": 0.5, "model": "m", "tenant": "t", "keys": ["00"]})
    p.add(big)
    assert p._pending == [big] and p.dropped == 1


def test_the_cluster_hands_the_allocators_free_memory_back():
    if not memtrim.available():
        pytest.skip("no glibc malloc_trim here")
    thread = start_memory_upkeep({"PREWARM_MALLOC_TRIM_SECONDS": "0.05"})
    assert thread is not None and thread.is_alive() and thread.name == "malloc-trim"
    assert memtrim.wait_for_trim(60)
