"""End to end on production settings: daphne, a Celery worker and beat on Redis, PostgreSQL,
three real agent processes moving real bytes over TCP, a dashboard websocket watching."""

from __future__ import annotations

import time

import pytest

from controlplane.core import blockhash
from nodeagent.blockstore import FileBlockStore, block_digest, transfer_checksum
from tests.e2e.harness import DashboardClient
from tests.live import wait_for
from tests.workflow import burst

pytestmark = [pytest.mark.services, pytest.mark.slow]
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


def jobs(cluster) -> list[dict]:
    return cluster.results("/api/replication-jobs/?page_size=500")


def later_demand(cluster, n: int = 400) -> None:
    """More of the burst's tenant arrives after placement: these requests are the replicas' hits."""
    now = time.time()
    cluster.post_records([{**r, "time": now - 2 + i / n} for i, r in enumerate(burst.records(now)[:n])])


def check_bytes_moved(cluster, job: dict) -> None:
    """The target's block store holds exactly the source's bytes; the checksum says so too."""
    engines = {e["id"]: e for e in cluster.engines().values()}
    target = engines[job["target"]]
    node = cluster.node_of(int(target["endpoints"]["transfer"].rpartition(":")[2]))
    store = FileBlockStore(node.store_dir)
    for key in burst.PREFIX:
        assert bytes(store.read(key)) == cluster.source_bytes[key], f"block {key:x} differs on {node.name}"
    want = transfer_checksum(block_digest(cluster.source_bytes[k]) for k in burst.PREFIX)
    assert job["checksum"] == want


def holders(cluster) -> set[int]:
    resp = cluster.api("POST", "/api/residency/lookup/", json={"keys": [blockhash.to_hex(k) for k in burst.PREFIX]})
    resp.raise_for_status()
    return {h["engine"] for h in resp.json()["holders"] if h["depth"] == len(burst.PREFIX)}


def test_burst_to_forecast_plan_copies_residency_score_and_dashboard(services_cluster):
    cluster = services_cluster
    dash = DashboardClient(cluster)
    try:
        wait_for(lambda: dash.seen('"snapshot"'), 30, what="the dashboard snapshot")
        source = next(e for e in cluster.engines().values() if e["node_name"] == "node-0")
        wait_for(lambda: holders(cluster) == {source["id"]}, 30, what="the source's prefix in residency")
        # Auto mode before the burst: otherwise beat may plan it under the default shadow policy.
        cluster.activate_policy("auto")
        cluster.post_burst()
        t0 = time.time()
        wait_for(lambda: cluster.results("/api/forecasts/"), 60, what="a forecast")
        # Auto approval follows the plan's own commit: wait for the decision, then check it.
        plan = wait_for(lambda: next((p for p in cluster.results("/api/plans/")
                                      if p["item_count"] and p["state"] != "proposed"), None),
                        60, what="a decided plan with items")
        assert plan["mode"] == "auto" and plan["state"] in ("approved", "executing", "done"), plan
        done = wait_for(lambda: (js := jobs(cluster)) and all(j["state"] in TERMINAL for j in js) and js,
                        cluster.job_ceiling_s(), what="every job finished")
        print(f"burst -> every job finished in {time.time() - t0:.1f}s: {[j['state'] for j in done]}")
        assert {j["state"] for j in done} == {"succeeded"}, done
        for job in done:
            assert job["source"] == source["id"]
            check_bytes_moved(cluster, job)
        targets = {j["target"] for j in done}
        assert targets <= holders(cluster) and source["id"] in holders(cluster)
        # Scoring: demand after placement lands on the replicas.
        later_demand(cluster)
        scored = wait_for(lambda: [r for r in cluster.results("/api/speculative-replicas/") if r["hits"] > 0],
                          60, what="replicas with hits")
        assert {r["engine"] for r in scored} <= targets and all(not r["shadow"] for r in scored)
        board = cluster.get("/api/scoreboard/")
        assert board["totals"]["hits"] > 0 and board["totals"]["bytes_moved"] > 0
        # The dashboard saw every step.
        for what in ('"forecasts"', '"plans"', '"succeeded"', '"residency"'):
            assert dash.seen(what), f"the dashboard never saw {what}"
    finally:
        dash.close()
