"""End to end on production settings: daphne, a Celery worker and beat on Redis, PostgreSQL,
three real agent processes moving real bytes over TCP, a dashboard websocket watching."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import burst
from harness.e2e.dashboard import DashboardClient
from harness.processes import wait_for
from nodeagent.blockstore import FileBlockStore, block_digest, transfer_checksum
from wire import blockhash

pytestmark = [pytest.mark.services, pytest.mark.slow]
TERMINAL = {
    "landed",
    "confirmed",
    "unconfirmed",
    "lost",
    "succeeded",
    "failed",
    "cancelled",
    "expired",
    "redundant",
    "partial",
}


def jobs(cluster) -> list[dict]:
    return cluster.results("/api/replication-jobs/?page_size=500")


def later_demand(cluster, n: int = 400) -> None:
    """More of the burst's tenant arrives after placement: these requests are the replicas' hits."""
    now = time.time()
    cluster.post_records(
        [{**r, "time": now - 2 + i / n} for i, r in enumerate(burst.records(now)[:n])]
    )


def check_bytes_moved(cluster, job: dict) -> None:
    """The target's block store holds exactly the source's bytes; the checksum says so too."""
    engines = {e["id"]: e for e in cluster.engines().values()}
    target = engines[job["target"]]
    node = cluster.node_of(int(target["endpoints"]["transfer"].rpartition(":")[2]))
    store = FileBlockStore(node.store_dir)
    for key in burst.PREFIX:
        assert bytes(store.read(key)) == cluster.source_bytes[key], (
            f"block {key:x} differs on {node.name}"
        )
    want = transfer_checksum(block_digest(cluster.source_bytes[k]) for k in burst.PREFIX)
    assert job["checksum"] == want


def scrape(cluster) -> dict[tuple, float]:
    """``/api/metrics/`` as Prometheus reads it: (sample name, sorted labels) -> value."""
    resp = cluster.api("GET", "/api/metrics/")
    resp.raise_for_status()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(resp.text)
        for s in fam.samples
    }


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def holders(cluster) -> set[int]:
    resp = cluster.api(
        "POST", "/api/residency/lookup/", json={"keys": [blockhash.to_hex(k) for k in burst.PREFIX]}
    )
    resp.raise_for_status()
    return {h["engine"] for h in resp.json()["holders"] if h["depth"] == len(burst.PREFIX)}


def test_burst_to_forecast_plan_copies_residency_score_and_dashboard(services_cluster):
    cluster = services_cluster
    dash = DashboardClient(cluster)
    try:
        wait_for(lambda: dash.seen('"snapshot"'), 30, what="the dashboard snapshot")
        source = next(e for e in cluster.engines().values() if e["node_name"] == "node-0")
        wait_for(
            lambda: holders(cluster) == {source["id"]}, 30, what="the source's prefix in residency"
        )
        before = scrape(cluster)
        assert metric(before, "prewarm_agents", state="active") == cluster.n_nodes
        # The target engines load copied KV only once the test has seen the copies land.
        loaders = [n.loader for n in cluster.nodes if n.loader]
        for loader in loaders:
            loader.loading.clear()
        # Auto mode before the burst: otherwise beat may plan it under the default shadow policy.
        cluster.activate_policy("auto")
        cluster.post_burst()
        t0 = time.time()
        wait_for(lambda: cluster.results("/api/forecasts/"), 60, what="a forecast")
        # Auto approval follows the plan's own commit: wait for the decision, then check it.
        plan = wait_for(
            lambda: next(
                (
                    p
                    for p in cluster.results("/api/plans/")
                    if p["item_count"] and p["state"] != "proposed"
                ),
                None,
            ),
            60,
            what="a decided plan with items",
        )
        assert plan["mode"] == "auto" and plan["state"] in ("approved", "executing", "done"), plan
        done = wait_for(
            lambda: (js := jobs(cluster)) and all(j["state"] in TERMINAL for j in js) and js,
            cluster.job_ceiling_s(),
            what="every job finished",
        )
        print(
            f"burst -> every job finished in {time.time() - t0:.1f}s: {[j['state'] for j in done]}"
        )
        assert {j["state"] for j in done} == {"landed"}, done
        for job in done:
            assert job["source"] == source["id"]
            check_bytes_moved(cluster, job)
        targets = {j["target"] for j in done}
        # Landed in the agents' stores is not resident: no gateway is routed there yet.
        assert not targets & holders(cluster)
        # The engines load the KV their agents copied (the bytes checked against the source's)
        # and their own KV events say so: that confirms the copies.
        for loader in loaders:
            loader.loading.set()
        wait_for(
            lambda: {j["state"] for j in jobs(cluster)} == {"confirmed"},
            30,
            what="every copy confirmed by its engine's KV events",
        )
        assert targets <= holders(cluster) and source["id"] in holders(cluster)
        # The scrape saw it all move: reports applied by the web process, the plan, the jobs
        # and their bytes, the replicas (the worker's doing, read from the database).
        moved = sum(j["bytes_done"] for j in done)

        seen: dict[str, float] = {}

        def metrics_moved():
            m = scrape(cluster)
            seen.update(
                reports=metric(m, "prewarm_reports_applied_total")
                - metric(before, "prewarm_reports_applied_total"),
                latencies=metric(m, "prewarm_report_apply_seconds_count")
                - metric(before, "prewarm_report_apply_seconds_count"),
                jobs=metric(m, "prewarm_jobs", state="confirmed", transport="tcp"),
                bytes=metric(m, "prewarm_moved_bytes", transport="tcp"),
                approved=metric(m, "prewarm_plan_items", decision="approved"),
                live=metric(m, "prewarm_replicas", kind="live"),
                planned_at=metric(m, "prewarm_plan_last_timestamp_seconds"),
                sockets=metric(m, "prewarm_agent_sockets"),
            )
            ok = (
                seen["reports"] > 0
                and seen["latencies"] > 0
                and seen["jobs"] == len(done)
                and seen["bytes"] == moved > 0
                and seen["approved"] >= len(done)
                and seen["live"] >= len(targets)
                and seen["planned_at"] > 0
                and seen["sockets"] >= cluster.n_nodes
            )  # a reconnect may overlap its old socket
            return m if ok else None

        try:
            m = wait_for(metrics_moved, 30, what="the metrics moving with the run")
        except AssertionError:
            raise AssertionError(
                f"the metrics did not move with the run: {seen} (moved {moved})"
            ) from None
        print(
            f"metrics: {metric(m, 'prewarm_reports_applied_total'):.0f} reports applied, "
            f"plan cycle {metric(m, 'prewarm_plan_cycle_seconds'):.3f}s, {moved} bytes moved"
        )
        # Scoring: demand after placement lands on the replicas.
        later_demand(cluster)
        scored = wait_for(
            lambda: [r for r in cluster.results("/api/speculative-replicas/") if r["hits"] > 0],
            60,
            what="replicas with hits",
        )
        assert {r["engine"] for r in scored} <= targets and all(not r["shadow"] for r in scored)
        wait_for(
            lambda: metric(scrape(cluster), "prewarm_replica_hits", kind="live") > 0,
            30,
            what="replica hits in the metrics",
        )
        board = cluster.get("/api/scoreboard/")
        assert board["totals"]["hits"] > 0 and board["totals"]["bytes_moved"] > 0
        # The dashboard saw every step.
        for what in ('"plans"', '"confirmed"', '"residency"'):  # no page shows forecasts live
            assert dash.seen(what), f"the dashboard never saw {what}"
    finally:
        dash.close()


def test_a_target_that_computed_the_prefix_before_dispatch_gets_no_copy_and_no_credit(
    services_cluster,
):
    """Manual mode: the plan proposes copies of the prefix; before the operator approves it,
    the first item's target engine computes the prefix itself (its own traffic, in its own KV
    events). At dispatch the control plane sees that engine hold it: the job ends redundant
    without being sent, no replica, no credit. Any other item's copy lands and its engine's
    events confirm it."""
    cluster = services_cluster
    source = next(e for e in cluster.engines().values() if e["node_name"] == "node-0")
    wait_for(
        lambda: holders(cluster) == {source["id"]}, 30, what="the source's prefix in residency"
    )
    cluster.activate_policy("manual")
    cluster.post_burst()
    plan = wait_for(
        lambda: next((p for p in cluster.results("/api/plans/") if p["item_count"]), None),
        90,
        what="a proposed plan with items",
    )
    assert plan["state"] == "proposed" and not jobs(cluster), plan
    print(f"plan {plan['id']}: {plan['item_count']} items")
    early, *others = [i["target"] for i in plan["items"]]
    cluster.node_of_engine(early).publish_stored(burst.PREFIX_TOKENS)
    wait_for(lambda: early in holders(cluster), 30, what="the early engine's prefix in residency")
    resp = cluster.api("POST", f"/api/plans/{plan['id']}/approve/", json={})
    assert resp.status_code == 200 and resp.json()["refused"] == {}, resp.text
    done = wait_for(
        lambda: (
            (js := {j["target"]: j for j in jobs(cluster)})
            and len(js) == len(plan["items"])
            and js[early]["state"] == "redundant"
            and all(js[t]["state"] == "confirmed" for t in others)
            and js
        ),
        cluster.job_ceiling_s(),
        what="the early engine's job redundant, every other copy confirmed by its engine",
    )
    assert done[early]["bytes_done"] == 0 and done[early]["attempt"] == 0, done[early]
    for t in others:
        check_bytes_moved(cluster, done[t])
    replicas = [r for r in cluster.results("/api/speculative-replicas/") if not r["shadow"]]
    assert {r["engine"] for r in replicas} == set(others), replicas
    # Demand after placement: the early engine serves the prefix from its own cache, which no
    # copy caused; only the copies' replicas are scored.
    later_demand(cluster)
    if others:
        wait_for(
            lambda: [r for r in cluster.results("/api/speculative-replicas/") if r["hits"] > 0],
            60,
            what="the copies' replicas scored",
        )
    board = cluster.get("/api/scoreboard/")
    assert board["totals"]["replicas"] == len(others), board["totals"]
    scored = cluster.results("/api/speculative-replicas/")
    assert all(r["engine"] != early for r in scored), scored
    if not others:
        assert board["totals"]["hits"] == 0 and board["totals"]["ttft_saved_s"] == 0
