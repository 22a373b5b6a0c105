"""Authenticated transfers: only a sender that proves the job's secret may deliver blocks.

A host that learns a job id (it travels in clear) connects to the target's transfer port with that
id and bytes of its choice, checksummed as the old protocol let the sender do: it is refused before
a block is read, nothing lands in the store, and the target's job result says whom it refused.
"""

import json
import os
import socket
import struct
import threading
import time
import uuid

import pytest

from harness.processes import free_port
from nodeagent.blockstore import FileBlockStore, MemoryBlockStore, block_digest, transfer_checksum
from nodeagent.transfers.auth import AuthError, sign, verify
from nodeagent.transfers.base import Job
from nodeagent.transfers.tcp import MAGIC, UNKNOWN_JOB, TcpTransferServer, TcpTransport
from tests.agent.test_transfer_processes import start_agent, stop, wait_result
from wire.blockhash import to_hex

BLOCK = 64 << 10


def stranger_delivers(addr: str, job_id: str, keys, payload: bytes, mac: str | None, until: float):
    """What an attacker would do: retry until the target knows the job, then send a header."""
    header = {
        "job_id": job_id,
        "attempt": 1,
        "keys": [to_hex(k) for k in keys],
        "sizes": [len(payload)] * len(keys),
        "checksum": transfer_checksum(block_digest(payload) for _ in keys),
    }
    if mac is not None:
        header["mac"] = mac
    host, port = addr.rsplit(":", 1)
    while time.time() < until:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            body = json.dumps(header).encode()
            s.sendall(MAGIC + struct.pack("!I", len(body)) + body)
            n = struct.unpack("!I", s.recv(4))[0]
            answer = json.loads(s.recv(n))
            if answer.get("error") != UNKNOWN_JOB:
                if answer.get("ok"):  # a target that accepted would now read the blocks
                    for _ in keys:
                        s.sendall(payload)
                return answer
        time.sleep(0.05)
    raise AssertionError("the target never knew the job")


def job(job_id, keys, role, target_addr, secret, deadline_s=30.0):
    return Job.from_message(
        {
            "id": job_id,
            "role": role,
            "transport": "tcp",
            "keys": [to_hex(k) for k in keys],
            "target": {"transfer": target_addr},
            "secret": secret,
            "deadline": time.time() + deadline_s,
        }
    )


@pytest.fixture
def server():
    store = MemoryBlockStore(1 << 30)
    srv = TcpTransferServer("127.0.0.1:0", store).start()
    yield srv, store
    srv.close()


def test_mac_covers_every_header_field():
    header = {"job_id": "j", "attempt": 1, "keys": ["01"], "sizes": [4], "checksum": "ab"}
    header["mac"] = sign("s3cret", header)
    verify("s3cret", header)
    for field, value in [("checksum", "cd"), ("keys", ["02"]), ("attempt", 2), ("job_id", "k")]:
        with pytest.raises(AuthError, match="bad mac"):
            verify("s3cret", {**header, field: value})
    with pytest.raises(AuthError, match="bad mac"):
        verify("other", header)
    with pytest.raises(AuthError, match="no mac"):
        verify("s3cret", {k: v for k, v in header.items() if k != "mac"})


def test_a_stranger_with_a_valid_job_id_is_refused_and_nothing_is_stored(server):
    srv, store = server
    keys = [0x9000 + i for i in range(3)]
    jid = str(uuid.uuid4())
    target = job(jid, keys, "target", srv.address, secret="the-real-secret", deadline_s=3.0)
    result = {}
    t = threading.Thread(
        target=lambda: result.update(r=TcpTransport(srv).receive(target, store, lambda n: None))
    )
    t.start()
    until = time.time() + 3.0
    evil = os.urandom(BLOCK)
    no_mac = stranger_delivers(srv.address, jid, keys, evil, None, until)
    forged = stranger_delivers(srv.address, jid, keys, evil, "00" * 32, until)
    assert not no_mac["ok"] and "not authenticated" in no_mac["error"]
    assert not forged["ok"] and "bad mac" in forged["error"]
    t.join(10)
    assert not t.is_alive()
    r = result["r"]
    assert not r.ok and "refused 2 unauthenticated sender(s)" in r.error and "127.0.0.1" in r.error
    assert not any(store.contains(k) for k in keys)


def test_a_sender_with_another_secret_is_told_why_and_the_genuine_one_succeeds(server):
    srv, dst = server
    src = MemoryBlockStore(1 << 30)
    keys = [0xA000 + i for i in range(4)]
    for k in keys:
        src.write(k, os.urandom(BLOCK))
    jid = str(uuid.uuid4())
    target = job(jid, keys, "target", srv.address, secret="s-attempt-1")
    result = {}
    t = threading.Thread(
        target=lambda: result.update(r=TcpTransport(srv).receive(target, dst, lambda n: None))
    )
    t.start()
    wrong = TcpTransport(None).send(
        job(jid, keys, "source", srv.address, "guessed"), src, lambda n: None
    )
    assert not wrong.ok and "not authenticated" in wrong.error
    assert not any(dst.contains(k) for k in keys)
    right = TcpTransport(None).send(
        job(jid, keys, "source", srv.address, "s-attempt-1"), src, lambda n: None
    )
    t.join(10)
    assert right.ok and result["r"].ok and result["r"].checksum == right.checksum
    assert all(bytes(dst.read(k)) == bytes(src.read(k)) for k in keys)


def test_a_job_without_a_secret_sends_nothing(server):
    srv, _ = server
    src = MemoryBlockStore(1 << 30)
    src.write(1, b"x" * 10)
    r = TcpTransport(None).send(job("j", [1], "source", srv.address, ""), src, lambda n: None)
    assert not r.ok and "no transfer secret" in r.error


@pytest.mark.slow
def test_a_real_agent_refuses_a_stranger_and_its_job_result_says_why(control_plane, tmp_path):
    port = free_port()
    dst = start_agent(control_plane, tmp_path, "dst", "enrol-1", tmp_path / "dst-blocks", port)
    try:
        assert control_plane.wait_for(lambda: len(control_plane.nodes) == 1, 20)
        d = control_plane.node_id("dst")
        keys = [0xB000 + i for i in range(2)]
        jid = str(uuid.uuid4())
        deadline = time.time() + 4
        control_plane.assign(
            d,
            {
                "id": jid,
                "role": "target",
                "action": "replicate",
                "transport": "tcp",
                "keys": [to_hex(k) for k in keys],
                "secret": "per-job-secret",
                "target": {"transfer": f"127.0.0.1:{port}"},
                "deadline": deadline,
            },
        )
        answer = stranger_delivers(
            f"127.0.0.1:{port}", jid, keys, os.urandom(BLOCK), None, deadline
        )
        assert not answer["ok"] and "not authenticated" in answer["error"]
        failed = wait_result(control_plane, jid, d, timeout=20)
        assert (
            failed["state"] == "failed" and "refused 1 unauthenticated sender(s)" in failed["error"]
        )
        assert failed["bytes"] == 0
        assert not any(FileBlockStore(tmp_path / "dst-blocks").contains(k) for k in keys)
    finally:
        stop(dst)


def test_the_transfer_server_listens_only_where_the_operator_says(tmp_path):
    from nodeagent.agent import Agent
    from nodeagent.config import ConfigError, enabled_transports, load_config

    base = [
        "--control-plane-url",
        "http://127.0.0.1:9",
        "--state-dir",
        str(tmp_path),
        "--gpu-source",
        "none",
        "--metrics-listen",
        "",
    ]
    default = load_config(base, env={})
    assert default.transfer.listen == ""  # no 0.0.0.0 unless someone writes it
    assert enabled_transports(default.transfer) == [
        "lmcache",
        "warmup",
        "lmcache-mp",
    ]  # no listening port
    agent = Agent(default)
    assert agent.server is None and agent.transfer_address == ""
    port = free_port()
    named = load_config([*base, "--transfer-listen", f"127.0.0.1:{port}"], env={})
    assert enabled_transports(named.transfer) == ["tcp", "nccl", "lmcache", "warmup", "lmcache-mp"]
    agent = Agent(named)
    try:
        assert agent.server is not None and agent.transfer_address == f"127.0.0.1:{port}"
    finally:
        agent.server.close()
    lm_only = load_config(
        [*base, "--transfer-listen", "127.0.0.1:0", "--transfer-transports", "lmcache"], env={}
    )
    assert Agent(lm_only).server is None  # a listen address alone opens nothing
    with pytest.raises(
        ConfigError, match="'udp' is not one of tcp, nccl, lmcache, warmup, lmcache-mp"
    ):
        load_config([*base, "--transfer-transports", "tcp,udp"], env={})


def test_the_source_sends_no_block_to_a_target_that_cannot_prove_the_secret():
    src = MemoryBlockStore(1 << 30)
    keys = [0xC000, 0xC001]
    for k in keys:
        src.write(k, os.urandom(BLOCK))
    got = {"bytes": 0}
    lsock = socket.create_server(("127.0.0.1", 0))
    addr = f"127.0.0.1:{lsock.getsockname()[1]}"

    def impostor():  # accepts whatever comes, as a host in the target's place would
        conn, _ = lsock.accept()
        with conn:
            conn.recv(4)
            n = struct.unpack("!I", conn.recv(4))[0]
            while n:
                n -= len(conn.recv(n))
            body = json.dumps({"ok": True, "mac": "ff" * 32}).encode()
            conn.sendall(struct.pack("!I", len(body)) + body)
            conn.settimeout(2)
            try:
                while chunk := conn.recv(1 << 16):
                    got["bytes"] += len(chunk)
            except OSError:
                pass

    t = threading.Thread(target=impostor)
    t.start()
    r = TcpTransport(None, retries=0).send(job("j", keys, "source", addr, "s"), src, lambda n: None)
    t.join(10)
    lsock.close()
    assert not r.ok and "did not prove the job's secret" in r.error
    assert got["bytes"] == 0
