"""The ``lmcache-mp`` executor against the real LMCache 0.5.6 coordinator and two real
multiprocess servers on CPU (``lmcache_mp`` in conftest.py): ``mp-a``'s engine prefilled a
prefix, the executor prefetches it on ``mp-b`` through the coordinator, mp-b loads it from the
L2 tier the servers share and reports it, and the coordinator's directory (the servers' own
cache events) confirms it; a prefetch the servers cannot fill leaves the directory without the
target, and the control plane does not confirm that copy. Then unpin and delete, and the errors.
"""

from __future__ import annotations

import pytest

from controlplane.fleet.models import Engine, Node
from controlplane.replication.choices import JobState, Transport
from controlplane.replication.models import ReplicationJob, SpeculativeReplica
from controlplane.replication.tasks import sweep_jobs
from harness.processes import wait_for
from nodeagent.blockstore import MemoryBlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job, TransferResult
from nodeagent.transfers.lmcache_mp import LmcacheMpTransport
from tests.lmcache.conftest import MP_MODEL, tokens
from tests.lmcache.test_lmcache_job import run_on_agent
from tests.workflow.conftest import eager  # noqa: F401 - the fixture
from wire import blockhash

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]
BLOCK = 16


def job(toks: list[int], action: str = "replicate", target: str = "mp-b") -> Job:
    return Job.from_message(
        {
            "id": "mp-1",
            "action": action,
            "role": "target",
            "transport": "lmcache-mp",
            "keys": [],
            "target": {"engine_id": "vllm-b"},
            "tokens": toks,
            "lmcache": {"model_name": MP_MODEL, "target_instance": target},
        }
    )


def executor(url: str) -> LmcacheMpTransport:
    engine = EngineConfig(
        engine_id="vllm-b", kv_events="tcp://127.0.0.1:1", lmcache_instance_id="mp-b"
    )
    return LmcacheMpTransport({"vllm-b": engine}, url, poll_s=0.05)


def on_mp_b(mp, toks: list[int]) -> list[bool]:
    return ["mp-b" in {i for i, tier in chunk if tier == "l1"} for chunk in mp.directory(toks)]


def test_prefetch_is_confirmed_by_the_directory_pinned_and_deleted(lmcache_mp):
    mp = lmcache_mp
    toks = tokens(1_000, 1_768)  # three whole 256-token chunks
    mp.store("mp-a", toks)  # mp-a's engine prefilled the prefix: its L1 and the shared L2
    wait_for(
        lambda: all(("mp-a", "l1") in c for c in mp.directory(toks)),
        30,
        what="mp-a's store events in the directory",
    )
    assert on_mp_b(mp, toks) == [False] * 3
    ex = executor(mp.coordinator)
    result = ex.receive(job(toks), MemoryBlockStore(1), lambda n: None)
    assert result.ok, result.error
    assert result.extra["confirmation"] == {
        "by": "lmcache-directory",
        "tokens": 768,
        "before": 0,  # the directory listed nothing on mp-b before the prefetch
        "chunks": 3,
        "instance_id": "mp-b",
    }
    assert on_mp_b(mp, toks) == [True] * 3
    # A second prefetch of what the target already lists places nothing: the reading's
    # "before" equals what the plan asks for, which the control plane judges redundant.
    again = ex.receive(job(toks), MemoryBlockStore(1), lambda n: None)
    assert again.ok and again.extra["confirmation"]["before"] == 768, again.extra
    # The replica ends: unpinned, and mp-b's copy deleted through the coordinator (mp-b
    # reports the deletion; mp-a keeps its own).
    gone = ex.evict(job(toks, action="evict"))
    assert gone.ok, gone.error
    wait_for(lambda: on_mp_b(mp, toks) == [False] * 3, 30, what="mp-b's copy gone")
    assert all(("mp-a", "l1") in c for c in mp.directory(toks))


def test_a_prefetch_the_directory_does_not_show_is_not_confirmed(
    lmcache_mp,
    transactional_db,
    eager,  # noqa: F811
    settings,
):
    """No server holds these tokens anywhere: mp-b's prefetch completes with nothing found,
    the directory lists none of it on mp-b, and the control plane, judging the executor's
    reading against the tokens its plan asked for, does not confirm the copy: it ends
    unconfirmed, its replica evicted, never credited."""
    mp = lmcache_mp
    toks = tokens(90_000, 90_768)
    ex = executor(mp.coordinator)
    result = ex.receive(job(toks), MemoryBlockStore(1), lambda n: None)
    assert result.ok, result.error
    assert result.extra["confirmation"]["tokens"] == 0, result.extra
    assert on_mp_b(mp, toks) == [False] * 3
    settings.PREWARM_REPLICA_CONFIRM_SECONDS = 0.0
    copy = judged(toks, result)
    assert copy.state == JobState.LANDED  # no evidence: never confirmed
    sweep_jobs.delay()
    copy.refresh_from_db()
    replica = SpeculativeReplica.objects.get(job=copy)
    assert copy.state == JobState.UNCONFIRMED and replica.confirmed_at is None
    assert replica.evicted_at is not None and replica.hits == 0


def test_the_control_plane_confirms_what_the_directory_shows(
    lmcache_mp,
    transactional_db,
    eager,  # noqa: F811
):
    mp = lmcache_mp
    toks = tokens(2_000, 2_768)
    mp.store("mp-a", toks)
    wait_for(
        lambda: all(("mp-a", "l1") in c for c in mp.directory(toks)),
        30,
        what="mp-a's store events in the directory",
    )
    result = executor(mp.coordinator).receive(job(toks), MemoryBlockStore(1), lambda n: None)
    copy = judged(toks, result)
    replica = SpeculativeReplica.objects.get(job=copy)
    assert copy.state == JobState.CONFIRMED and replica.confirmed_by == "lmcache-directory"
    assert replica.tokens == replica.new_tokens == 768


def test_the_targets_own_l2_copy_is_not_its_engines_copy(lmcache_mp):
    """mp-b's engine prefilled the prefix long ago: mp-b wrote it to the shared L2 too, and its
    L1 copy was deleted since. The directory lists mp-b in L2 only, which the engine cannot use:
    the reading before the prefetch is 0, and the prefetch puts the prefix back in L1."""
    mp = lmcache_mp
    toks = tokens(3_000, 3_768)
    mp.store("mp-b", toks)
    wait_for(lambda: on_mp_b(mp, toks) == [True] * 3, 30, what="mp-b's store events")
    ex = executor(mp.coordinator)
    assert ex.evict(job(toks, action="evict")).ok  # L1 only: the L2 file stays
    wait_for(lambda: on_mp_b(mp, toks) == [False] * 3, 30, what="mp-b's L1 copy gone")
    assert all(("mp-b", "l2") in c for c in mp.directory(toks))
    result = ex.receive(job(toks), MemoryBlockStore(1), lambda n: None)
    assert result.ok, result.error
    reading = result.extra["confirmation"]
    assert (reading["before"], reading["tokens"]) == (0, 768), reading


def judged(toks: list[int], result: TransferResult) -> ReplicationJob:
    """The control plane's lmcache-mp job for ``toks`` on mp-b's engine, after its target agent
    reported ``result`` (the executor's reading) as the job's result."""
    node = Node.objects.create(name="node-b")
    target = Engine.objects.create(
        node=node,
        engine_id="vllm-b",
        model=MP_MODEL,
        block_size=BLOCK,
        bytes_per_block=BLOCK * 1024,
        kv_capacity_blocks=100_000,
        endpoints={"lmcache_instance_id": "mp-b"},
    )
    chain = [blockhash.to_hex(k) for k in blockhash.chain_keys(toks, BLOCK)]
    copy = ReplicationJob.objects.create(
        transport=Transport.LMCACHE_MP,
        target=target,
        prefix_keys=chain,
        state=JobState.DISPATCHED,
        attempt=1,
    )
    run_on_agent(target, copy, result)
    copy.refresh_from_db()
    return copy


def test_a_wrong_instance_and_a_prefix_shorter_than_a_chunk_say_so(lmcache_mp):
    url = lmcache_mp.coordinator
    # An agent without the engine's configuration takes the job's instance, which is unknown.
    bad = LmcacheMpTransport({}, url).receive(
        job(tokens(0, 768), target="nope"), MemoryBlockStore(1), lambda n: None
    )
    assert not bad.ok and "nope" in bad.error and "404" in bad.error, bad.error
    short = executor(url).receive(job(tokens(0, 100)), MemoryBlockStore(1), lambda n: None)
    assert not short.ok and "shorter than one" in short.error, short.error
