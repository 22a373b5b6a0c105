"""Two real agent processes move real bytes over TCP, checksum-verified; a killed receiver fails
the job cleanly and the retried job succeeds."""

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from controlplane.core.blockhash import to_hex
from nodeagent.blockstore import FileBlockStore

REPO = Path(__file__).resolve().parents[2]
BLOCK = 1 << 20
# Each job's deadline: the agents end it (succeeded or failed) by then, so it bounds every wait
# for a result. A passing test waits seconds.
JOB_DEADLINE_S = 60.0
# An agent process importing its modules and enrolling: seconds normally, more on a loaded machine.
AGENT_START_S = 60.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_agent(cp, tmp_path, name, token, store_dir, port, extra=""):
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(f"""
control_plane_url = "{cp.url}"
enrolment_token = "{token}"
hostname = "{name}"
state_dir = "{tmp_path / (name + "-state")}"
report_interval_s = 0.5
metrics_listen = ""
gpu_source = "none"
jobs_transport = "long-poll"
long_poll_wait_s = 1
backoff_max_s = 1.0
[transfer]
listen = "127.0.0.1:{port}"
block_store = "files"
block_store_path = "{store_dir}"
retries = 1
connect_timeout_s = 2.0
{extra}
""")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "nodeagent", "--config", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def job(job_id, keys, src_port, dst_port, attempt=1):
    return {
        "id": job_id,
        "action": "replicate",
        "transport": "tcp",
        "keys": [to_hex(k) for k in keys],
        "bytes": len(keys) * BLOCK,
        "bytes_per_block": BLOCK,
        "source": {"node_id": 1, "transfer": f"127.0.0.1:{src_port}"},
        "target": {"node_id": 2, "transfer": f"127.0.0.1:{dst_port}"},
        "secret": f"secret-{job_id}",  # the control plane's per-job secret
        "deadline": time.time() + JOB_DEADLINE_S,
        "attempt": attempt,
    }


def dispatch(cp, spec, src_node, dst_node):
    cp.assign(src_node, {**spec, "role": "source"})
    cp.assign(dst_node, {**spec, "role": "target"})


def wait_result(cp, job_id, node, timeout=JOB_DEADLINE_S + 15):
    """An agent ends every job by its deadline, so its result is due by then (plus a report)."""

    def done():
        return [e for e in cp.results(job_id) if e["node"] == node]

    assert cp.wait_for(lambda: bool(done()), timeout), f"no result for {job_id} from node {node}"
    return done()[-1]


@pytest.fixture
def blocks(tmp_path):
    store = FileBlockStore(tmp_path / "src-blocks")
    keys = [0x1000 + i for i in range(24)]
    for k in keys:
        store.write(k, os.urandom(BLOCK))
    return store, keys


def stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(10)


@pytest.mark.slow
def test_two_agents_move_verified_bytes(control_plane, tmp_path, blocks):
    store, keys = blocks
    sp, dp = free_port(), free_port()
    src = start_agent(control_plane, tmp_path, "src", "enrol-1", store.dir, sp)
    dst = start_agent(control_plane, tmp_path, "dst", "enrol-2", tmp_path / "dst-blocks", dp)
    try:
        assert control_plane.wait_for(lambda: len(control_plane.nodes) == 2, AGENT_START_S)
        s, d = control_plane.node_id("src"), control_plane.node_id("dst")
        jid = str(uuid.uuid4())
        dispatch(control_plane, job(jid, keys, sp, dp), s, d)
        target = wait_result(control_plane, jid, d)
        source = wait_result(control_plane, jid, s)
        assert target["state"] == "succeeded" and target["bytes"] == len(keys) * BLOCK
        assert target["checksum"] == source["checksum"]
        got = FileBlockStore(tmp_path / "dst-blocks")
        assert all(bytes(got.read(k)) == bytes(store.read(k)) for k in keys)
        # Delivering the same job again answers from the journal, nothing runs twice.
        dispatch(control_plane, job(jid, keys, sp, dp), s, d)
        assert control_plane.wait_for(lambda: len(control_plane.results(jid)) == 4, JOB_DEADLINE_S)
        assert {e["state"] for e in control_plane.results(jid)} == {"succeeded"}
    finally:
        stop(src, dst)


@pytest.mark.slow
def test_receiver_killed_mid_transfer_fails_cleanly_then_retry_succeeds(
    control_plane, tmp_path, blocks
):
    store, keys = blocks
    sp, dp = free_port(), free_port()
    # 4 MB/s: the 24 MiB transfer takes ~6 s, time enough to kill the receiver in the middle.
    src = start_agent(
        control_plane, tmp_path, "src", "enrol-1", store.dir, sp, "rate_limit_bytes_per_s = 4000000"
    )
    dst = start_agent(control_plane, tmp_path, "dst", "enrol-2", tmp_path / "dst-blocks", dp)
    dst2 = None
    try:
        assert control_plane.wait_for(lambda: len(control_plane.nodes) == 2, AGENT_START_S)
        s, d = control_plane.node_id("src"), control_plane.node_id("dst")
        jid = str(uuid.uuid4())
        dispatch(control_plane, job(jid, keys, sp, dp), s, d)
        assert control_plane.wait_for(
            lambda: any(
                e["type"] == "job.progress" and e["node"] == d and e["bytes_done"] >= 4 * BLOCK
                for e in control_plane.events
            ),
            JOB_DEADLINE_S,
        )
        dst.kill()
        dst.wait()
        failed = wait_result(control_plane, jid, s)
        assert failed["state"] == "failed" and "failed" in failed["error"]
        assert not any(FileBlockStore(tmp_path / "dst-blocks").contains(k) for k in keys)
        # The control plane retries the job (attempt 2) with a fresh receiver.
        dst2 = start_agent(control_plane, tmp_path, "dst2", "enrol-3", tmp_path / "dst2-blocks", dp)
        assert control_plane.wait_for(lambda: len(control_plane.nodes) == 3, AGENT_START_S)
        d2 = control_plane.node_id("dst2")
        dispatch(control_plane, job(jid, keys, sp, dp, attempt=2), s, d2)
        ok = wait_result(control_plane, jid, d2)
        assert ok["state"] == "succeeded"
        got = FileBlockStore(tmp_path / "dst2-blocks")
        assert all(bytes(got.read(k)) == bytes(store.read(k)) for k in keys)
    finally:
        stop(src, dst, *(p for p in [dst2] if p))
