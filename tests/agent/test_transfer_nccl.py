"""Two real agent processes move real bytes with the ``nccl`` transport (``torch.distributed``
send/recv, ``gloo`` backend on CPU), verified by the receiver's checksum; a peer that never joins
the rendezvous fails the job by its deadline with nothing stored."""

import os
import time
import uuid

import pytest

from harness.processes import free_port
from nodeagent.blockstore import FileBlockStore
from tests.agent.fake_control_plane import FakeControlPlane
from tests.agent.test_transfer_processes import (
    AGENT_START_S,
    start_agent,
    stop,
    wait_result,
)
from wire.blockhash import to_hex

pytest.importorskip(
    "torch.distributed", reason="the nccl transport needs torch (pip install -e '.[nccl]')"
)

BLOCK = 1 << 20
pytestmark = pytest.mark.slow  # two agent processes importing torch: a few seconds


def nccl_job(keys, master_port, deadline_s):
    job_id = str(uuid.uuid4())
    return {
        "id": job_id,
        "secret": f"secret-{job_id}",
        "action": "replicate",
        "transport": "nccl",
        "keys": [to_hex(k) for k in keys],
        "bytes": len(keys) * BLOCK,
        "bytes_per_block": BLOCK,
        "source": {"node_id": 1},
        "target": {"node_id": 2},
        "rendezvous": {"master_addr": "127.0.0.1", "master_port": master_port, "world_size": 2},
        "deadline": time.time() + deadline_s,
        "attempt": 1,
    }


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """One fake control plane and two agents (source store filled), shared by the tests."""
    tmp = tmp_path_factory.mktemp("nccl")
    store = FileBlockStore(tmp / "src-blocks")
    keys = [0x2000 + i for i in range(12)]
    for k in keys:
        store.write(k, os.urandom(BLOCK))
    cp = FakeControlPlane(enrolment_tokens=("enrol-1", "enrol-2"))
    src = start_agent(cp, tmp, "src", "enrol-1", store.dir, free_port())
    dst = start_agent(cp, tmp, "dst", "enrol-2", tmp / "dst-blocks", free_port())
    try:
        assert cp.wait_for(lambda: len(cp.nodes) == 2, AGENT_START_S), "agents did not enrol"
        yield cp, store, keys, FileBlockStore(tmp / "dst-blocks")
    finally:
        stop(src, dst)
        cp.stop()


def test_two_agents_move_verified_bytes_over_gloo(agents):
    cp, store, keys, got = agents
    s, d = cp.node_id("src"), cp.node_id("dst")
    # The first job starts torch.distributed in both agents: seconds, more on a loaded machine.
    spec = nccl_job(keys, free_port(), deadline_s=120)
    cp.assign(s, {**spec, "role": "source"})
    cp.assign(d, {**spec, "role": "target"})
    target = wait_result(cp, spec["id"], d, timeout=120 + 15)  # the agents end it by its deadline
    source = wait_result(cp, spec["id"], s, timeout=120 + 15)
    assert target["state"] == "succeeded", target["error"]
    assert source["state"] == "succeeded", source["error"]
    assert target["bytes"] == source["bytes"] == len(keys) * BLOCK
    assert target["checksum"] == source["checksum"] is not None
    assert all(bytes(got.read(k)) == bytes(store.read(k)) for k in keys)
    progress = [
        e["bytes_done"]
        for e in cp.events
        if e["type"] == "job.progress" and e.get("job_id") == spec["id"] and e["node"] == d
    ]
    assert progress and max(progress) == len(keys) * BLOCK


def test_source_never_joins_fails_target_by_deadline_with_nothing_stored(agents):
    cp, _, _, got = agents
    d = cp.node_id("dst")
    fresh = [0x3000 + i for i in range(4)]  # keys the target has never held
    spec = nccl_job(fresh, free_port(), deadline_s=3)
    cp.assign(d, {**spec, "role": "target"})  # the source is never told: it never joins
    failed = wait_result(cp, spec["id"], d, timeout=3 + 15)  # failed by its deadline, then reported
    assert failed["state"] == "failed"
    # Which of the two deadlines speaks first depends on the machine's load: torch's rendezvous
    # timeout (set to the time left) or the agent's own abort at the deadline plus its grace.
    assert failed["error"].startswith(
        ("nccl receive failed: peer did not join", "deadline passed before the job ended")
    ), failed["error"]
    assert failed["bytes"] == 0 and failed["checksum"] is None
    assert not any(got.contains(k) for k in fresh)
    assert not list(got.dir.glob("*.tmp"))


def test_bytes_that_do_not_match_the_checksum_are_not_stored(agents):
    cp, store, _, got = agents
    s, d = cp.node_id("src"), cp.node_id("dst")
    keys = [0x4000 + i for i in range(4)]
    for k in keys:
        store.write(k, os.urandom(BLOCK))

    def replicate():
        spec = nccl_job(keys, free_port(), deadline_s=120)
        cp.assign(s, {**spec, "role": "source"})
        cp.assign(d, {**spec, "role": "target"})
        return (
            wait_result(cp, spec["id"], d, timeout=120 + 15),
            wait_result(cp, spec["id"], s, timeout=120 + 15),
        )

    target, _ = replicate()  # the source agent now holds these blocks' digests
    assert target["state"] == "succeeded", target["error"]
    before = {k: bytes(got.read(k)) for k in keys}
    # Rot one block on the source's disk behind its back: the bytes sent no longer match the
    # digest the source announces, as if they were corrupted on the way.
    path = store.dir / f"{keys[2]:016x}.blk"
    path.write_bytes(os.urandom(BLOCK))
    target, source = replicate()
    assert target["state"] == "failed" and "checksum mismatch" in target["error"]
    assert source["state"] == "failed" and "checksum mismatch" in source["error"]
    assert {k: bytes(got.read(k)) for k in keys} == before
