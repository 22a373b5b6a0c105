"""The ``lmcache`` executor against the real LMCache 0.5.6 controller and two standalone engines
on CPU: a copy keeps the source, a pin on the target confirms it, renewals keep it, ``/clear``
skips pinned chunks and frees an engine's own chunks once their lease lapsed, a copy outlives its
lapsed lease until the executor's evict hands it back to the source, a wrong instance gives a
clear error. (The control plane's side: tests/lmcache/test_lmcache_job.py.)

``mock_memory`` (the standalone engines' transfer channel) moves keys, not bytes, between
processes: the bytes of an LMCache copy are a GPU-machine check (NIXL)."""

from __future__ import annotations

import time

import pytest

from harness.processes import wait_for
from nodeagent.blockstore import MemoryBlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job
from nodeagent.transfers.lmcache import LmcacheController, LmcacheTransport
from tests.lmcache.conftest import PIN_CHECK_S, PIN_TIMEOUT_S, tokens

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]
ENGINE_B = EngineConfig(engine_id="vllm-b", kv_events="tcp://127.0.0.1:1", lmcache_instance_id="B")
LAPSE_S = PIN_TIMEOUT_S + 4 * PIN_CHECK_S + 10  # a lease ends within its timeout and a check


def job(
    toks: list[int],
    source: str = "A",
    hold_s: float = 600.0,
    jid: str = "j-1",
    action: str = "replicate",
) -> Job:
    return Job.from_message(
        {
            "id": jid,
            "action": action,
            "role": "target",
            "transport": "lmcache",
            "keys": [],
            "source": {"engine_id": "vllm-a"},
            "target": {"engine_id": "vllm-b"},
            "lmcache": {
                "source_instance": source,
                "source_location": "LocalCPUBackend",
                "target_instance": "B",
            },
            "tokens": toks,
            "block_size": 16,
            "bytes_per_block": 16 * 1024,
            "bytes": len(toks) * 1024,
            "hold_until": time.time() + hold_s,
        }
    )


def executor(cluster, tmp_path, renew_s: float = 3600.0) -> LmcacheTransport:
    return LmcacheTransport({"vllm-b": ENGINE_B}, cluster.url, renew_s, tmp_path / "leases.json")


def test_copy_keeps_the_source_and_a_pin_on_the_target_confirms_it(lmcache_cluster, tmp_path):
    c = lmcache_cluster
    a0, b0 = c.key_count("A"), c.key_count("B")
    assert c.store("A", 0, 600) == a0 + 2  # whole 256-token chunks only
    result = executor(c, tmp_path).receive(job(tokens(0, 600)), MemoryBlockStore(1), lambda n: None)
    assert result.ok, result.error
    # Read on the target before and after the copy: the control plane judges the copy on the
    # difference against the tokens its plan asked for (600 asked, 512 placed: partial).
    assert result.extra["confirmation"] == {
        "by": "lmcache-pin",
        "tokens": 512,
        "before": 0,
        "copied": 512,
        "instance_id": "B",
    }
    assert result.bytes == 512 * 1024  # the copied tokens at the engine's bytes per token
    # should_copy: the source keeps its chunks (a move would have taken them: A 2 -> 0).
    assert c.key_count("A") == a0 + 2
    wait_for(lambda: c.key_count("B") == b0 + 2, 30, what="the copy's chunks registered on B")


def test_a_wrong_instance_gives_a_clear_error_and_moves_nothing(lmcache_cluster, tmp_path):
    c = lmcache_cluster
    b0 = c.key_count("B")
    bad = executor(c, tmp_path).receive(
        job(tokens(0, 600), source="Z"), MemoryBlockStore(1), lambda n: None
    )
    assert not bad.ok
    assert (
        "'Z'" in bad.error and "not registered" in bad.error and "lmcache_instance_id" in bad.error
    ), bad.error
    no_prefix = executor(c, tmp_path).receive(
        job(tokens(50_000, 50_600)), MemoryBlockStore(1), lambda n: None
    )
    assert not no_prefix.ok and "copied no tokens" in no_prefix.error, no_prefix.error
    down = LmcacheTransport({"vllm-b": ENGINE_B}, "http://127.0.0.1:9").receive(
        job(tokens(0, 600)), MemoryBlockStore(1), lambda n: None
    )
    assert not down.ok and "did not answer" in down.error
    assert c.key_count("B") == b0


def test_renewed_while_live_then_the_lease_lapses_and_clear_frees_it(lmcache_cluster, tmp_path):
    """The executor's lease keeper against a real engine's pins, on chunks the engine stored
    itself (those that arrive by a copy are never freed by a lapse: the next test)."""
    from nodeagent.transfers.lmcache import Lease, LeaseKeeper, LmcacheController

    c = lmcache_cluster
    c.clear("A")
    base = c.key_count("A")  # chunks still pinned by the copies of the other tests
    c.store("A", 10_000, 10_512)
    keeper = LeaseKeeper(
        LmcacheController(c.url), renew_s=PIN_CHECK_S, path=tmp_path / "leases.json"
    )
    hold_s = LAPSE_S + 5
    keeper.add(
        Lease("j-lease", "A", "LocalCPUBackend", tokens(10_000, 10_512), 512, time.time() + hold_s)
    )
    readings = keeper.renew_due()
    assert readings and readings[0]["tokens"] == 512 and readings[0]["error"] is None, readings
    # Clear skips pinned chunks.
    c.clear("A")
    assert c.key_count("A") == base + 2
    # While the replica is held the lease is renewed: past the lease's own timeout, clear
    # still skips it. (The keeper persists its leases: a restarted agent goes on renewing.)
    assert LeaseKeeper(None, 1.0, tmp_path / "leases.json").leases.keys() == {"j-lease"}
    start = time.monotonic()

    def renewed_past_timeout() -> bool:
        readings.extend(keeper.renew_due())
        return time.monotonic() - start > PIN_TIMEOUT_S + 2 * PIN_CHECK_S

    wait_for(renewed_past_timeout, LAPSE_S, interval=PIN_CHECK_S, what="renewals past the timeout")
    c.clear("A")
    assert c.key_count("A") == base + 2, "a renewed lease was cleared"
    assert all(r["tokens"] == 512 and r["type"] == "job.confirm" for r in readings)
    # The hold ends: no more renewals, the lease lapses, and clear frees the chunks.
    assert keeper.renew_due(now=time.time() + hold_s) == [] and not keeper.leases

    def freed() -> bool:
        c.clear("A")
        return c.key_count("A") == base

    wait_for(freed, LAPSE_S, interval=PIN_CHECK_S, what="the lapsed lease's chunks cleared")


def test_a_copy_outlives_its_lapsed_lease_until_the_evict_job_moves_it_back(
    lmcache_cluster, tmp_path
):
    """LMCache 0.5.6 never frees chunks that arrived by a copy: after the lease lapsed ``/clear``
    skips them (as 0.5.6's source reads, its P2P receive keeps a reference to each). The
    replica ends by the executor's evict job (as the agent runs it), which moves them back to
    the source: the target holds none of them, the source keeps its own."""
    from nodeagent.jobs import JobRunner, Journal

    c = lmcache_cluster
    toks = tokens(40_000, 40_512)
    c.store("A", 40_000, 40_512)
    a0, b0 = c.key_count("A"), c.key_count("B")
    ex = executor(c, tmp_path, renew_s=PIN_CHECK_S)
    copied = ex.receive(job(toks, jid="j-copy"), MemoryBlockStore(1), lambda n: None)
    assert copied.ok and copied.extra["confirmation"]["tokens"] == 512, copied.error
    wait_for(lambda: c.key_count("B") == b0 + 2, 30, what="the copy's chunks registered on B")
    # The hold ends: the keeper drops the lease, and the engine's pin monitor lets it lapse.
    assert ex.leases.renew_due(now=time.time() + 3600) == [] and not ex.leases.leases
    wait_for(lambda: c.pinned("B") == 0, LAPSE_S, interval=PIN_CHECK_S, what="B's leases lapsed")
    # LMCache's own way to free a tier frees none of the copy.
    assert c.clear("B") == 0 and c.key_count("B") == b0 + 2
    # The agent runs the evict job the control plane sends when the hold ends.
    runner = JobRunner(Journal(tmp_path / "journal"), MemoryBlockStore(1), {"lmcache": ex})
    gone = runner._execute(job(toks, jid="j-evict", action="evict"), lambda n: None)
    assert gone.ok, gone.error
    wait_for(lambda: c.key_count("B") == b0, 30, what="the copy's chunks gone from B")
    assert "512 tokens removed from B" in gone.extra["detail"], gone.extra
    assert LmcacheController(c.url).pin("B", "LocalCPUBackend", toks) == 0
    assert c.key_count("A") == a0  # the source kept its chunks and gained none
    # A second evict finds nothing to remove and says so.
    again = runner._execute(job(toks, jid="j-evict-2", action="evict"), lambda n: None)
    assert again.ok and "held none" in again.extra["detail"], again.extra
