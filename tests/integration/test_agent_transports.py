"""A real agent process starts with any set of its transports, reports it, runs a job of a
transport it has and refuses one of a transport it lacks, the refusal reaching the control plane
as the job's failure reason."""

from __future__ import annotations

import json
import os
import sys

import httpx
import pytest

from harness.live import LiveControlPlane
from harness.processes import Proc, free_port, wait_for
from tests.realvllm.helpers import user_token
from wire import protocol

pytestmark = pytest.mark.slow

FULL = ",".join(
    (
        protocol.TRANSPORT_TCP,
        protocol.TRANSPORT_NCCL,
        protocol.TRANSPORT_LMCACHE,
        protocol.TRANSPORT_WARMUP,
        protocol.TRANSPORT_LMCACHE_MP,
    )
)
# transports setting -> (a transport it has: its evict job runs; one it lacks: refused, or None)
SETS = {
    protocol.TRANSPORT_TCP: (protocol.TRANSPORT_TCP, protocol.TRANSPORT_WARMUP),
    protocol.TRANSPORT_WARMUP: (protocol.TRANSPORT_WARMUP, protocol.TRANSPORT_TCP),
    f"{protocol.TRANSPORT_TCP},{protocol.TRANSPORT_WARMUP}": (
        protocol.TRANSPORT_TCP,
        protocol.TRANSPORT_LMCACHE,
    ),
    protocol.TRANSPORT_LMCACHE: (protocol.TRANSPORT_LMCACHE, protocol.TRANSPORT_TCP),
    FULL: (protocol.TRANSPORT_WARMUP, None),
}
NEEDS_LISTEN = (protocol.TRANSPORT_TCP, protocol.TRANSPORT_NCCL)

# Run in the control plane (manage.py shell): one evict job per (node, transport) on the node's
# engine, approved and dispatched as the dispatch task would; prints {"node/transport": job id}.
MAKE_JOBS = """
import json
from controlplane.fleet.models import Engine
from controlplane.replication.models import ReplicationJob
from controlplane.replication.jobs.delivery import dispatch
out = {}
for node, transport in PAIRS:
    job = ReplicationJob.objects.create(
        action="evict", transport=transport, target=Engine.objects.get(node__name=node),
        prefix_keys=["00000000000000aa"], state="approved", max_attempts=1,
    )
    dispatch(job.pk)
    out[f"{node}/{transport}"] = str(job.pk)
print(json.dumps(out))
"""


def node_name(transports: str) -> str:
    return "node-" + transports.replace(",", "-")


def start_agent(cp: LiveControlPlane, transports: str, enrol: str, tmp_path) -> Proc:
    state = tmp_path / node_name(transports)
    listen = (
        f"127.0.0.1:{free_port()}" if any(n in NEEDS_LISTEN for n in transports.split(",")) else ""
    )
    flags = {
        "control-plane-url": cp.url,
        "enrolment-token": enrol,
        "hostname": node_name(transports),
        "state-dir": str(state),
        "gpu-source": "none",
        # An engine whose publisher is not there: the agent waits for its events.
        "engine": f"engine_id=e0,kv_events=tcp://127.0.0.1:{free_port()},model=m,block_size=16",
        "report-interval-s": "0.5",
        "metrics-listen": "",
        "jobs-transport": "long-poll",
        "long-poll-wait-s": "2",
        "transfer-transports": transports,
        "transfer-listen": listen,
        "backoff-max-s": "1",
    }
    argv = [sys.executable, "-m", "nodeagent"]
    for name, value in flags.items():
        argv += [f"--{name}", value]
    return Proc(
        node_name(transports), argv, {**os.environ, "PYTHONUNBUFFERED": "1"}, tmp_path
    ).start()


def test_an_agent_runs_with_any_set_of_transports(tmp_path):
    cp = LiveControlPlane(tmp_path)
    agents: list[Proc] = []
    try:
        cp.manage("migrate", "-v0")
        cp.manage("ensure_user", "ops", "--password", "pw-123456789", "--role", "admin")
        cp.start()
        token = user_token(cp)
        enrol = cp.manage("create_enrolment_token", "--max-uses", str(len(SETS)))
        agents = [start_agent(cp, t, enrol, tmp_path) for t in SETS]

        def get(path: str) -> dict:
            resp = httpx.get(
                cp.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=10
            )
            resp.raise_for_status()
            return resp.json()

        def reported() -> dict[str, list[str]]:
            return {n["name"]: n["transports"] for n in get("/api/nodes/")["results"]}

        want = {node_name(t): t.split(",") for t in SETS}
        wait_for(lambda: reported() == want, 90, interval=0.5, what="every agent's transports")
        for a in agents:
            assert a.alive(), a.tail(3000)

        pairs = [(node_name(t), n) for t, ns in SETS.items() for n in ns if n]
        jobs = json.loads(
            cp.manage(
                "shell", "--no-imports", "-c", f"PAIRS = {pairs!r}\n{MAKE_JOBS}"
            ).splitlines()[-1]
        )

        def finished() -> dict[str, dict] | None:
            got = {str(j["id"]): j for j in get("/api/replication-jobs/?limit=50")["results"]}
            done = {
                k: got[i] for k, i in jobs.items() if got[i]["state"] in ("succeeded", "failed")
            }
            return done if len(done) == len(jobs) else None

        done = wait_for(finished, 90, interval=0.5, what="every job's result")
        for transports, (has, lacks) in SETS.items():
            node = node_name(transports)
            ran = done[f"{node}/{has}"]
            # It reached the executor: an LMCache evict without a controller says so itself.
            assert "is not enabled on this agent" not in ran["error"], (node, ran)
            if has != protocol.TRANSPORT_LMCACHE:
                assert ran["state"] == "succeeded", (node, ran)
            else:
                assert ran["state"] == "failed" and "lmcache" in ran["error"], (node, ran)
            if lacks:
                refused = done[f"{node}/{lacks}"]
                assert refused["state"] == "failed", (node, refused)
                assert f"transport {lacks!r} is not enabled on this agent" in refused["error"]
                assert "transfer.transports" in refused["error"], refused["error"]
        for a in agents:
            assert a.alive(), a.tail(3000)
    finally:
        for a in agents:
            a.stop()
        cp.close()
