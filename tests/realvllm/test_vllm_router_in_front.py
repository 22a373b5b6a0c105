"""vllm-router in front, Prewarm beside: a joining engine warmed by a Prewarm job gets the
prefix's next requests from vllm-router, which learns it holds the prefix from that engine's own
KV events; the engine's request tap records the cached tokens it served them with, and the
scoreboard counts that request as the replica's measured hit.

Nothing tells the router about Prewarm: it is the stock ``vllm-router`` (``kv_aware`` policy)
subscribed to both engines' KV-event sockets, sending to the agents' request taps, and every
request record the control plane gets after the demand history comes from those taps. Engine A
holds the tenant's prefix (it served it), and its agent reads a stand-in ``/metrics`` saying A is
busy, so the planner sees demand overflowing A and warms B; then A's cache is emptied (as an
eviction would), so the only holder the router can know of is B, through B's ``BlockStored``
events for the warm-up.
"""

from __future__ import annotations

import random
import time

import httpx
import pytest

from harness.e2e.engines import EngineMetricsServer
from harness.processes import wait_for
from harness.realvllm.engine import (
    BLOCK_SIZE,
    BYTES_PER_BLOCK,
    KV_CAPACITY_BLOCKS,
    MODEL_NAME,
    EngineUnavailable,
)
from harness.realvllm.router import RouterFront
from tests.realvllm.conftest import unavailable
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

TENANT = MODEL_NAME  # the taps' default tenant rule: the request's model name
_draw = random.Random("router-tenant-prefix")
PREFIX = [_draw.randrange(4, 2048) for _ in range(40 * BLOCK_SIZE)]
CHAIN = blockhash.chain_keys(PREFIX, BLOCK_SIZE)


def own(n: int = BLOCK_SIZE) -> list[int]:
    """A request's own tail after the shared prefix."""
    return [random.randrange(4, 2048) for _ in range(n)]


def cached(answer: dict) -> int:
    return int((answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_vllm_router_sends_the_prefix_to_the_engine_prewarm_warmed(
    routed_engines, worker_plane, tmp_path
):
    cp = worker_plane
    a, b = routed_engines
    fresh(a)
    fresh(b)
    busy = EngineMetricsServer(0.9)
    front = RouterFront(tmp_path, [a, b])  # the router sends to both taps from the start
    taps, router = front.taps, front.router
    tap_url = {name: front.tap_url(name) for name in taps}
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
        **{**extra, "openai_url": a.url, "metrics_url": busy.url, "tap_listen": taps[a.name]},
    )
    agent_b = start_agent(
        cp,
        b,
        tmp_path / "agent-b",
        "node-b",
        jobs="websocket",
        **{**extra, "openai_url": b.url, "tap_listen": taps[b.name]},
    )
    try:
        wait_for(
            lambda: {a.name, b.name} <= set(engine_blocks(cp)), 60, what="both engines reported"
        )
        try:
            router.start().wait_ready(120)  # it starts serving once both taps answer /health
        except EngineUnavailable as exc:
            unavailable(str(exc))

        def chosen(since: int) -> list[tuple[str, int]]:
            """(worker, credited cached tokens) of each routing choice since the ``since``th."""
            return [(d.worker, d.credited_tokens) for d in router.decisions()[since:]]

        # A served the tenant's prefix before (directly: no tap has recorded it yet).
        a.complete(PREFIX + own())
        wait_for(
            lambda: lookup_depth(cp, PREFIX, a.name)[1] == len(CHAIN),
            30,
            what="A holding the prefix",
        )
        assert lookup_depth(cp, PREFIX, b.name)[1] == 0

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
        # Demand history for the forecaster, as the e2e tests post it: the burst ends just before
        # the current minute's bucket; what follows must happen within this minute (a forecast
        # in the next bucket sees the live rate only), so it starts early in a minute.
        if time.time() % 60 > 10:
            time.sleep(61 - time.time() % 60)
        resp = httpx.post(
            f"{cp.url}/api/request-records/",
            json={"records": demand(time.time(), TENANT, PREFIX)},
            headers={"Authorization": f"Bearer {cp.gateway}"},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        plans: list[dict] = []

        def plans_now() -> list[dict]:
            plans[:] = api(cp, "GET", "/api/plans/?limit=5").json()["results"]
            return plans

        # A warm-up needs the prefix's token ids, which the control plane keeps from the first
        # record carrying them after a plan wanted the key (A's tap sends them every 10 s
        # per prefix): the tenant's live traffic starts once a plan waits for them.
        wait_for(
            lambda: any(p["summary"].get("waiting_for_token_ids") for p in plans_now()),
            40,
            interval=1,
            what="a plan waiting for the prefix's token ids",
        )
        # The tenant's traffic goes through the router, which knows from A's events that A
        # holds the prefix: to A, its cached prefix credited.
        seen = len(router.decisions())
        assert cached(router.complete(PREFIX + own())) >= len(PREFIX)
        assert chosen(seen) == [(tap_url[a.name], len(PREFIX))], router.decisions()[seen:]

        def proposed() -> dict | None:
            router.complete(PREFIX + own())
            return next((p for p in plans_now() if p["state"] == "proposed" and p["items"]), None)

        try:
            plan = wait_for(proposed, 60, interval=1, what="a proposed plan with an item")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; plans: {[p.get('summary') for p in plans]}") from exc
        resp = api(cp, "POST", f"/api/plans/{plan['id']}/approve/", json={})
        assert resp.status_code == 200, resp.text

        def confirmed() -> dict | None:
            for j in job_states(cp):
                if j["state"] in ("failed", "unconfirmed", "lost"):
                    raise AssertionError(f"job {j['id']} {j['state']}: {j.get('error')}")
            router.complete(PREFIX + own())
            return next((j for j in job_states(cp) if j["state"] == "confirmed"), None)

        job = wait_for(confirmed, 120, interval=1, what="the warm-up job confirmed")
        assert job["transport"] == "warmup"
        assert lookup_depth(cp, PREFIX, b.name)[1] == len(CHAIN)  # B's own BlockStored events
        # B got the prefix from the warm-up, which B's agent sent to B's engine, not through the
        # router or a tap: the router sent the prefix to A, or (once B's events announced the
        # warm-up, B holding it as much as A) to B with the whole prefix credited, never to B
        # to compute it.
        assert all(w == tap_url[a.name] or c == len(PREFIX) for w, c in chosen(seen)), (
            router.decisions()[seen:]
        )

        # A's cache empties (AllBlocksCleared goes out with A's next step).
        fresh(a)
        a.complete(own(3))
        wait_for(lambda: lookup_depth(cp, PREFIX, a.name)[1] == 0, 30, what="A's cache emptied")
        seen = len(router.decisions())
        answers = [router.complete(PREFIX + own(BLOCK_SIZE + 5)) for _ in range(3)]
        # The router sends each to B, counting the prefix B's events announced as cached ...
        assert chosen(seen) == [(tap_url[b.name], len(PREFIX))] * 3, router.decisions()[seen:]
        # ... and B serves it from the warmed cache.
        assert all(cached(r) >= len(PREFIX) for r in answers), [r["usage"] for r in answers]

        # B's tap records them (serving engine, cached tokens): the replica's measured hits, these
        # three and any the router sent B while the job was confirmed (served_hits grows as the
        # records are ingested, hits when the replica is next scored).
        def scored() -> dict | None:
            reps = api(cp, "GET", f"/api/speculative-replicas/?job={job['id']}").json()["results"]
            rep = next((r for r in reps if r["job"] == job["id"]), None)
            done = rep and rep["hits"] == rep["served_hits"] >= len(answers)
            return rep if done and rep["hits_basis"] == "measured" else None

        replica = wait_for(scored, 60, interval=0.5, what="the replica's hits from B's tap")
        assert replica["status"] == "confirmed" and replica["confirmed_by"] == "kv-events"
        board = api(cp, "GET", "/api/scoreboard/").json()
        assert board["totals"]["hits_basis"] == "measured", board["totals"]
        assert board["totals"]["hits"] == replica["hits"], board["totals"]
    finally:
        router.stop()
        for agent in (agent_a, agent_b):
            agent.stop()
            print(agent.tail())
        busy.close()
        print(router.last_error(20))
