"""Helpers for the real-vLLM tests: the control plane's view, a real agent process, and what
the engine itself announced (read from its replay socket, independently of the agent)."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import httpx
import msgpack
import zmq

from harness import burst as azure_burst
from harness.live import LiveControlPlane
from harness.processes import Proc, wait_for
from harness.realvllm.engine import BLOCK_SIZE, MODEL_NAME, VllmEngine
from wire import blockhash


def user_token(cp: LiveControlPlane) -> str:
    code = (
        "from django.contrib.auth.models import User; from controlplane.accounts.models import ApiToken;"
        "print(ApiToken.issue('user', 't', user=User.objects.get(username='ops'))[1])"
    )
    return cp.manage("shell", "--no-imports", "-c", code).splitlines()[-1]


def api(cp: LiveControlPlane, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(
        method, f"{cp.url}{path}", headers={"Authorization": f"Bearer {cp.token}"}, timeout=30, **kw
    )


def engine_blocks(cp: LiveControlPlane) -> dict[str, int]:
    """Resident blocks per engine id, all media together, as the control plane has them."""
    resp = api(cp, "GET", "/api/engines/?page_size=500")
    resp.raise_for_status()
    return {e["engine_id"]: sum(e["blocks"].values()) for e in resp.json()["results"]}


def lookup_depth(cp: LiveControlPlane, tokens: list[int], engine_id: str) -> tuple[list[int], int]:
    """The control plane's keys for these token ids and how deep ``engine_id`` holds them."""
    resp = api(
        cp, "POST", "/api/residency/lookup/", json={"token_ids": tokens, "block_size": BLOCK_SIZE}
    )
    resp.raise_for_status()
    body = resp.json()
    depth = max((h["depth"] for h in body["holders"] if h["engine_name"] == engine_id), default=0)
    return [int(k, 16) for k in body["keys"]], depth


def start_agent(
    cp: LiveControlPlane,
    engine: VllmEngine,
    state: Path,
    name: str = "node-a",
    jobs: str = "none",
    args: tuple[str, ...] = (),
    **engine_extra,
) -> Proc:
    """A real ``prewarm-agent`` process beside ``engine`` (no GPUs, no transfer server; jobs
    over the websocket when ``jobs="websocket"``)."""
    enrol_file = state / "enrolment"
    state.mkdir(parents=True, exist_ok=True)
    if not enrol_file.exists():  # a restarted agent keeps its identity in state_dir
        enrol_file.write_text(cp.manage("create_enrolment_token"))
    argv = [
        sys.executable,
        "-m",
        "nodeagent",
        "--control-plane-url",
        cp.url,
        "--enrolment-token",
        enrol_file.read_text().strip(),
        "--hostname",
        name,
        "--state-dir",
        str(state),
        "--gpu-source",
        "none",
        "--engine",
        engine.agent_engine_flag(**engine_extra),
        "--report-interval-s",
        "0.2",
        "--heartbeat-interval-s",
        "2",
        "--metrics-listen",
        "",
        "--engine-metrics-interval-s",
        "1",
        "--jobs-transport",
        jobs,
        "--transfer-listen",
        "",
        "--backoff-max-s",
        "1",
        *args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return Proc(f"agent-{name}", argv, env, state.parent).start()


class Announced:
    """What an engine announced, read independently of the agent: its replay socket's history
    folded into the set of engine block hashes resident now."""

    def __init__(self, engine: VllmEngine):
        self.engine = engine

    def batches(self) -> list[tuple[int, list]]:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.engine.replay_endpoint)
        try:
            sock.send_multipart([b"", (0).to_bytes(8, "big")])
            out = []
            while True:
                assert sock.poll(10_000), "the replay socket did not answer"
                frames = sock.recv_multipart()
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == -1:
                    return out
                out.append((seq, msgpack.unpackb(frames[3], raw=False, strict_map_key=False)[1]))
        finally:
            sock.close()

    def resident(self) -> set[int]:
        held: set[int] = set()
        for _, events in self.batches():
            for ev in events:
                if ev["type"] == "BlockStored":
                    held.update(ev["block_hashes"])
                elif ev["type"] == "BlockRemoved":
                    held.difference_update(ev["block_hashes"])
                elif ev["type"] == "AllBlocksCleared":
                    held.clear()
        return held


def burst(engine: VllmEngine, prompts: list[list[int]]) -> set[int]:
    """Serve every prompt (one generated token each); the canonical keys their full blocks get."""
    keys: set[int] = set()
    for p in prompts:
        engine.complete(p)
        keys.update(blockhash.chain_keys(p, BLOCK_SIZE))
    return keys


def prompts(seed: int, n: int = 8, prefix_len: int = 200) -> list[list[int]]:
    """Requests of three tenants: a shared prefix each plus a suffix of their own, lengths that
    are not multiples of the block size (the last, partial block is never cached)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(4, 2048) for _ in range(prefix_len)] for _ in range(3)]
    return [
        prefixes[i % 3] + [rng.randrange(4, 2048) for _ in range(rng.randrange(20, 300))]
        for i in range(n)
    ]


def fresh(engine: VllmEngine) -> None:
    """Empty the engine's prefix cache (the AllBlocksCleared goes out with its next step)."""
    wait_for(engine.reset_prefix_cache, 30, interval=0.5, what=f"{engine.name} prefix cache reset")


def settle(cp: LiveControlPlane, engine_id: str, want: int, timeout: float = 30.0) -> None:
    """Wait until the control plane holds ``want`` blocks for the engine (reports every 0.2 s)."""
    wait_for(
        lambda: engine_blocks(cp).get(engine_id) == want,
        timeout,
        interval=0.2,
        what=f"{want} resident blocks of {engine_id} (have {engine_blocks(cp).get(engine_id)})",
    )


def stop_quietly(proc: Proc) -> str:
    proc.stop()
    return proc.tail(4000)


def demand(end: float, tenant: str, prefix: list[int]) -> list[dict]:
    """The recorded Azure burst of the workflow tests (real arrival times) as this tenant's
    records: the prefix's token ids plus one block of its own each, ending just before the
    current minute's bucket (demand history for the forecaster, posted as a gateway would)."""
    arr = azure_burst.arrivals()
    shift = (end // 60 * 60 - 1.0) - arr[-1][0]
    return [
        {
            "time": t + shift,
            "tenant": tenant,
            "model": MODEL_NAME,
            "block_size": BLOCK_SIZE,
            "token_ids": prefix + [4 + (i + j) % 2000 for j in range(BLOCK_SIZE)],
            "prompt_tokens": len(prefix) + BLOCK_SIZE,
            "cached_tokens": len(prefix),
        }
        for i, (t, _) in enumerate(arr)
    ]


def job_states(cp: LiveControlPlane) -> list[dict]:
    resp = api(cp, "GET", "/api/replication-jobs/?limit=50")
    resp.raise_for_status()
    return resp.json()["results"]
