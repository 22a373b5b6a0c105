"""Reactive replication on real vLLM engines: with strategy ``reactive`` a prefix that turns
hot on engine A is copied to engine B at ingest (a warm-up job, approved by auto mode) and
confirmed by B's own KV events, with no forecast anywhere.

A really holds the tenant's prefix (it served it); its agent reads A's load from a stand-in
``/metrics`` saying A runs 12 requests (a CPU engine serving a handful of requests never is
busy), so the measured demand outruns A. Every KV event, residency row, job message and record
is real; the demand is the recorded Azure burst of the workflow tests, as the records of the
last minute a gateway posts.
"""

from __future__ import annotations

import random
import time

import httpx
import pytest

from harness.e2e.engines import EngineMetricsServer
from harness.processes import wait_for
from harness.realvllm.driver import Gateway, Target
from harness.realvllm.engine import (
    BLOCK_SIZE,
    BYTES_PER_BLOCK,
    KV_CAPACITY_BLOCKS,
    MODEL_NAME,
)
from tests.realvllm.helpers import (
    api,
    demand,
    engine_blocks,
    fresh,
    job_states,
    lookup_depth,
    start_agent,
)
from wire import blockhash

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# Its own tenant and prefix: the engines outlive the test, and the other tests' prefixes may
# still be in their KV-event replay.
TENANT = "reactive-tenant"
PREFIX = [
    random.Random("reactive-tenant-prefix").randrange(4, 2048) for _ in range(40 * BLOCK_SIZE)
]
CHAIN = blockhash.chain_keys(PREFIX, BLOCK_SIZE)


def test_reactive_strategy_warms_a_hot_prefix_into_the_second_engine(
    vllm_engines,
    worker_plane,  # noqa: F811
    tmp_path,
):
    cp = worker_plane
    a, b = vllm_engines["bind"], vllm_engines["connect"]
    fresh(a)
    fresh(b)
    busy = EngineMetricsServer(0.9)
    extra = {
        "served_model_name": MODEL_NAME,
        "bytes_per_block": BYTES_PER_BLOCK,
        "kv_capacity_blocks": KV_CAPACITY_BLOCKS,
    }
    agent_a = start_agent(
        cp,
        a,
        tmp_path / "agent-a",
        "node-a",
        jobs="websocket",
        **{**extra, "openai_url": a.url, "metrics_url": busy.url},
    )
    agent_b = start_agent(
        cp, b, tmp_path / "agent-b", "node-b", jobs="websocket", **{**extra, "openai_url": b.url}
    )
    gw = Gateway(
        cp.url,
        cp.gateway,
        [Target(a.name, a.url, node="node-a"), Target(b.name, b.url, node="node-b")],
        tenant=TENANT,
    )
    try:
        wait_for(
            lambda: {a.name, b.name} <= set(engine_blocks(cp)), 60, what="both engines reported"
        )
        gw.send(PREFIX + [5] * BLOCK_SIZE, target=gw.targets[a.name])
        wait_for(
            lambda: lookup_depth(cp, PREFIX, a.name)[1] == len(CHAIN),
            30,
            what="A holding the prefix",
        )
        assert lookup_depth(cp, PREFIX, b.name)[1] == 0
        assert gw.flush() == 1
        policy = {
            "name": "real-reactive",
            "active": True,
            "mode": "auto",
            "strategy": "reactive",
            "min_confidence": 0.0,
            "horizon_seconds": 300,
            "replica_ttl_seconds": 3600,
            "default_transport": "warmup",
            # No cycle within the test: whatever is planned is planned at ingest.
            "plan_every_seconds": 86400,
        }
        resp = api(cp, "POST", "/api/policies/", json=policy)
        assert resp.status_code == 201, resp.text
        # The first cycle runs at once (there is no plan yet), on no demand; the next is a day
        # away, so every plan after it is made at ingest.
        wait_for(
            lambda: api(cp, "GET", "/api/plans/?limit=5").json()["count"] >= 1,
            30,
            what="the first plan cycle",
        )
        resp = httpx.post(
            f"{cp.url}/api/request-records/",
            json={"records": demand(time.time(), TENANT, PREFIX)},
            headers={"Authorization": f"Bearer {cp.gateway}"},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text

        def confirmed() -> dict | None:
            for j in job_states(cp):
                if j["state"] in ("failed", "unconfirmed", "lost"):
                    raise AssertionError(f"job {j['id']} {j['state']}: {j.get('error')}")
            # The tenant's traffic goes on to A: its records carry the token ids the warm-up
            # needs (kept once a plan wanted the key), and each ingest reacts again.
            gw.send(
                PREFIX + [random.randrange(4, 2048) for _ in range(BLOCK_SIZE)],
                target=gw.targets[a.name],
            )
            gw.flush()
            return next((j for j in job_states(cp) if j["state"] == "confirmed"), None)

        job = wait_for(confirmed, 120, interval=1, what="the warm-up job confirmed")
        assert job["transport"] == "warmup"
        # B's own BlockStored events put the whole chain on B.
        assert lookup_depth(cp, PREFIX, b.name)[1] == len(CHAIN)
        plans = api(cp, "GET", "/api/plans/?limit=20").json()["results"]
        mine = [p for p in plans if p["items"]]
        assert mine and all(p["summary"]["trigger"] == "ingest" for p in mine), mine
        assert all(p["summary"]["strategy"] == "reactive" for p in mine)
        # No forecast was made or used.
        assert api(cp, "GET", "/api/forecasts/").json()["count"] == 0
    finally:
        for agent in (agent_a, agent_b):
            agent.stop()
            print(agent.tail())
        busy.close()
