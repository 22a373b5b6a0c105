"""The cache map API: cell states from real agent reports, VRAM split, bounds and roles."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.fleet.models import Engine
from controlplane.replication.models import ReplicationJob, SpeculativeReplica
from harness import fleet_seed as cluster


def agent_client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def viewer() -> APIClient:
    client = APIClient()
    client.force_authenticate(cluster.make_user("viewer"))
    return client


@pytest.fixture
def two_engines(db):
    _, raw = cluster.enrol("node-a")
    agent = agent_client(raw)
    hot, cold = cluster.chain(1, 4), cluster.chain(2, 3)
    cluster.hot_prefix("acme", hot, requests=50)
    cluster.hot_prefix("globex", cold, requests=5)
    body = cluster.report(
        1,
        "node-a",
        engines=2,
        mode="snapshot",
        residency={"vllm-0": cluster.stored(hot), "vllm-1": cluster.stored(hot[:2])},
    )
    assert agent.post("/api/agents/report/", body, format="json").status_code == 200
    return agent, hot, cold


def test_cells_show_resident_partial_and_absent_hottest_first(two_engines):
    data = viewer().get("/api/cache-map/").json()
    assert [p["tenant"] for p in data["prefixes"]] == ["acme", "globex"]  # by recent demand
    rows = {e["name"]: e for e in data["engines"]}
    assert rows["vllm-0"]["cells"] == "ra" and rows["vllm-0"]["depths"] == [4, 0]
    assert rows["vllm-1"]["cells"] == "pa" and rows["vllm-1"]["depths"] == [2, 0]
    assert rows["vllm-0"]["tiers"][0] == "G"


def test_a_report_changes_the_map(two_engines):
    agent, _, cold = two_engines
    body = cluster.report(2, "node-a", engines=2, residency={"vllm-1": cluster.stored(cold)})
    assert agent.post("/api/agents/report/", body, format="json").status_code == 200
    rows = {e["name"]: e for e in viewer().get("/api/cache-map/").json()["engines"]}
    assert rows["vllm-1"]["cells"] == "pr"


def test_speculative_and_in_flight_cells(two_engines):
    _, hot, cold = two_engines
    e0, e1 = Engine.objects.order_by("engine_id")
    now = timezone.now()
    replica = SpeculativeReplica.objects.create(
        engine=e0,
        prefix_keys=hot,
        bytes=4 * cluster.BYTES_PER_BLOCK,
        placed_at=now,
        expires_at=now + timedelta(minutes=5),
        confirmed_at=now,
        confirmed_by="kv-events",
    )
    ReplicationJob.objects.create(target=e1, source=e0, prefix_keys=cold, bytes=1, state="running")
    data = viewer().get("/api/cache-map/").json()
    rows = {e["name"]: e for e in data["engines"]}
    assert rows["vllm-0"]["cells"] == "sa" and rows["vllm-1"]["cells"] == "pf"
    gpu0 = next(g for g in data["gpus"] if g["uuid"] == "GPU-node-a-0")
    assert gpu0["speculative"] == 4 * cluster.BYTES_PER_BLOCK and gpu0["kv"] == 0
    # A copy that landed but the engine has not shown is not a replica (nor VRAM held) ...
    landed = ReplicationJob.objects.create(
        target=e1, source=e0, prefix_keys=hot, bytes=1, state="landed"
    )
    SpeculativeReplica.objects.create(
        engine=e1,
        job=landed,
        prefix_keys=hot,
        bytes=1,
        placed_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    rows = {e["name"]: e for e in viewer().get("/api/cache-map/").json()["engines"]}
    assert rows["vllm-1"]["cells"][0] == "u"
    # ... and a confirmed one the engine dropped shows as lost.
    SpeculativeReplica.objects.filter(pk=replica.pk).update(lost_at=now, evicted_at=now)
    page = viewer().get("/api/cache-map/").json()
    rows = {e["name"]: e for e in page["engines"]}
    assert rows["vllm-0"]["cells"][0] == "r"  # its blocks are still reported resident here
    assert "x" in page["states"] and "u" in page["states"]


def test_vram_split_adds_up_to_the_gpu(two_engines):
    for gpu in viewer().get("/api/cache-map/").json()["gpus"]:
        parts = (
            gpu["weights_runtime"]
            + gpu["kv"]
            + gpu["speculative"]
            + gpu["kv_pool_free"]
            + gpu["free"]
        )
        assert parts == pytest.approx(gpu["total"], abs=4)
        # 60 GiB used, 20k blocks x 2 MiB = ~39 GiB KV pool: the rest is weights and runtime
        assert gpu["weights_runtime"] == 60 * cluster.GIB - 20_000 * cluster.BYTES_PER_BLOCK


def test_paging_and_engine_filter_are_bounded(two_engines):
    client = viewer()
    page = client.get("/api/cache-map/?limit=1&offset=1").json()
    assert page["engines_total"] == 2 and [e["name"] for e in page["engines"]] == ["vllm-1"]
    assert len(page["gpus"]) == 1
    e1 = Engine.objects.get(engine_id="vllm-1")
    only = client.get(f"/api/cache-map/?engines={e1.pk}").json()
    assert [e["id"] for e in only["engines"]] == [e1.pk]
    for bad in ("limit=257", "limit=0", "prefixes=65", "offset=-1", "engines=x", "limit=abc"):
        resp = client.get(f"/api/cache-map/?{bad}")
        assert resp.status_code == 400, bad
        assert resp.json()["field"] in {"limit", "prefixes", "offset", "engines"}


@pytest.mark.parametrize(
    "who, status", [("anonymous", (401, 403)), ("norole", (403,)), ("viewer", (200,))]
)
def test_roles(db, who, status):
    client = APIClient()
    if who != "anonymous":
        client.force_authenticate(cluster.make_user(None if who == "norole" else who))
    assert client.get("/api/cache-map/").status_code in status


def test_engine_scoped_keys_are_shown_on_the_engine_row(two_engines):
    agent, hot, _ = two_engines
    rows = {e["name"]: e for e in viewer().get("/api/cache-map/").json()["engines"]}
    assert (
        rows["vllm-1"]["engine_scoped_at"] is None and rows["vllm-1"]["engine_scoped_blocks"] == 0
    )
    scoped = [[f"{0xE000 + i:016x}", None, "CPU", 1] for i in range(3)]  # flag 1: no token ids
    body = cluster.report(2, "node-a", engines=2, residency={"vllm-1": scoped})
    assert agent.post("/api/agents/report/", body, format="json").status_code == 200
    rows = {e["name"]: e for e in viewer().get("/api/cache-map/").json()["engines"]}
    assert rows["vllm-1"]["engine_scoped_blocks"] == 3 and rows["vllm-1"]["engine_scoped_at"]
    assert rows["vllm-0"]["engine_scoped_at"] is None
