"""An approved plan places a prefix in a second real vLLM engine with a warm-up request; the
engine's own KV events confirm the copy, its next request is served from it, and the
scoreboard counts that request, recorded by the gateway, as the replica's measured hit.

Engine A (the source) really holds the tenant's prefix: it served it. Its agent reads A's load
from a stand-in ``/metrics`` saying A is busy (a CPU engine serving a handful of requests never
is), so the planner sees demand overflowing A; every KV event, residency row, job message and
cached-token count is real. Demand history is the recorded Azure burst of the workflow tests
(real arrival times), each record carrying the tenant prefix's token ids at block size 32.
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

TENANT = "real-tenant"
PREFIX = [random.Random("real-tenant-prefix").randrange(4, 2048) for _ in range(40 * BLOCK_SIZE)]
CHAIN = blockhash.chain_keys(PREFIX, BLOCK_SIZE)


def test_approved_plan_warms_the_second_engine_and_its_events_confirm_it(
    vllm_engines, worker_plane, tmp_path
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
        # A serves the tenant's prefix: the engine holds it, its events put it in residency.
        gw.send(PREFIX + [5] * BLOCK_SIZE, target=gw.targets[a.name])
        wait_for(
            lambda: lookup_depth(cp, PREFIX, a.name)[1] == len(CHAIN),
            30,
            what="A holding the prefix",
        )
        assert lookup_depth(cp, PREFIX, b.name)[1] == 0
        assert gw.flush() == 1
        policy = {
            "name": "real-warmup",
            "active": True,
            "mode": "manual",
            "min_confidence": 0.0,
            "horizon_seconds": 300,
            "replica_ttl_seconds": 3600,
            "default_transport": "warmup",
            "forecast_every_seconds": 10,
            "plan_every_seconds": 10,
        }
        resp = api(cp, "POST", "/api/policies/", json=policy)
        assert resp.status_code == 201, resp.text

        # The burst ends before the current minute's bucket, never near its end (a forecast run in
        # the next, empty bucket would see no demand): the e2e tests' rule.
        if time.time() % 60 > 45:
            time.sleep(61 - time.time() % 60)
        resp = httpx.post(
            f"{cp.url}/api/request-records/",
            json={"records": demand(time.time(), TENANT, PREFIX)},
            headers={"Authorization": f"Bearer {cp.gateway}"},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text

        def proposed() -> dict | None:
            # The gateway keeps sending the tenant's traffic to A: a warm-up is planned only once
            # the control plane holds the prefix's token ids, which it keeps from the first record
            # carrying them after a plan wanted the key (until then the plan counts it waiting).
            gw.send(
                PREFIX + [random.randrange(4, 2048) for _ in range(BLOCK_SIZE)],
                target=gw.targets[a.name],
            )
            gw.flush()
            plans = api(cp, "GET", "/api/plans/?limit=5").json()["results"]
            return next((p for p in plans if p["state"] == "proposed" and p["items"]), None)

        plan = wait_for(proposed, 90, interval=1, what="a proposed plan with an item")
        resp = api(cp, "POST", f"/api/plans/{plan['id']}/approve/", json={})
        assert resp.status_code == 200, resp.text

        def confirmed() -> dict | None:
            for j in job_states(cp):
                if j["state"] in ("failed", "unconfirmed", "lost"):
                    raise AssertionError(f"job {j['id']} {j['state']}: {j.get('error')}")
            # The gateway keeps sending the tenant's traffic to A: the records carry token ids,
            # which the control plane keeps for the key the plan uses (the warm-up needs them).
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
        # The next request B serves for this tenant comes from the warmed cache.
        record = gw.send(PREFIX + [9] * (BLOCK_SIZE + 3), target=gw.targets[b.name])
        assert record and record["engine"] == f"node-b/{b.name}"
        assert record["cached_tokens"] >= len(PREFIX)
        assert gw.flush() == 1
        # The gateway's record of it is the replica's hit, counted as measured, not estimated.

        def scored() -> dict | None:
            reps = api(cp, "GET", f"/api/speculative-replicas/?job={job['id']}").json()["results"]
            rep = next((r for r in reps if r["job"] == job["id"]), None)
            # served_hits grows as the record is ingested; hits when the replica is next scored.
            return rep if rep and rep["hits"] >= 1 and rep["hits_basis"] == "measured" else None

        replica = wait_for(
            scored, 60, interval=0.5, what="the replica's hit scored from the record"
        )
        assert replica["status"] == "confirmed" and replica["confirmed_by"] == "kv-events"
        assert replica["hits"] == replica["served_hits"] >= 1
        # The warm-up's own prefill was B's first compute of the prefix: the replica is credited
        # at most one prefill of what it placed, and charged the warm-up's prefill.
        assert replica["new_tokens"] == replica["tokens"] == len(CHAIN) * BLOCK_SIZE
        assert replica["saving_basis"] in ("measured-ttft", "cost-model")
        assert replica["cost_basis"].startswith("warm-up prefill") and replica["cost_s"] > 0
        board = api(cp, "GET", "/api/scoreboard/").json()
        totals = board["totals"]
        assert totals["hits_basis"] == "measured" and totals["hits"] == replica["hits"], totals
        assert totals["ttft_saved_s"] == replica["ttft_saved_s"], totals  # one replica, one credit
        # Two CPU engines (vLLM's CPU build report no GPU): not on the simulator's map.
        assert board["recommendation"]["prior"] is None, board["recommendation"]
        assert "cannot be placed" in board["recommendation"]["text"]
    finally:
        for agent in (agent_a, agent_b):
            agent.stop()
            print(agent.tail())
        busy.close()
