"""Each served request's hit or miss reason, decided at ingest (controlplane/core/misses.py).

Every case is worked by hand: agents report residency through /api/agents/report/, a gateway
posts one record through /api/request-records/, and the reason is read back from
/api/miss-buckets/ and /api/misses/. The prefix is the 4-block chain A B C D (16-token blocks):
the first record of a workload key makes its shared chain the record's own chain.
"""

import time

import pytest

from controlplane.core import misses as m
from controlplane.demand.models import MissBucket, WorkloadKey
from controlplane.fleet.models import Engine
from controlplane.replication.models import ReplicationJob
from wire import blockhash

from .helpers import report as _report

CHAIN = [0xA1, 0xB2, 0xC3, 0xD4]
HEX = [blockhash.to_hex(k) for k in CHAIN]
BS = 16


def rows(chain, upto=None):
    """Report rows storing ``chain[:upto]`` on GPU, each with its parent."""
    keys = [blockhash.to_hex(k) for k in chain[:upto]]
    return [(k, keys[i - 1] if i else None, "GPU") for i, k in enumerate(keys)]


def report(seq, stored=(), removed=(), mode="delta"):
    return _report(seq, stored, removed, mode=mode)


class Agent:
    """An enrolled agent posting reports about its own GPU."""

    def __init__(self, client, gpu):
        self.client, self.gpu = client, gpu

    def post(self, url, body, format):
        body["gpus"][0]["uuid"] = self.gpu
        body["engines"][0]["gpu_uuids"] = [self.gpu]
        return self.client.post(url, body, format=format)


@pytest.fixture
def fleet(enrol):
    """Two nodes, one engine each (node-a/vllm-0 serves the records); returns their agents."""
    a = Agent(enrol("node-a")[1], "GPU-aaa")
    b = Agent(enrol("node-b")[1], "GPU-bbb")
    for agent in (a, b):
        resp = agent.post("/api/agents/report/", report(1, mode="snapshot"), format="json")
        assert resp.status_code == 200, resp.content
    return a, b


def post(gateway, cached, **extra):
    rec = {
        "time": time.time(),
        "model": "llama3-70b",
        "tenant": "acme",
        "keys": HEX,
        "block_size": BS,
        "prompt_tokens": len(HEX) * BS,
        "cached_tokens": cached,
        "engine": "node-a/vllm-0",
        **extra,
    }
    resp = gateway.post("/api/request-records/", {"records": [rec]}, format="json")
    assert resp.status_code == 200, resp.content


@pytest.fixture
def viewer(client_for):
    return client_for("viewer")


def reason_of(viewer):
    """The one served request's reason, as /api/miss-buckets/ lists it."""
    resp = viewer.get("/api/miss-buckets/?tenant=acme")
    assert resp.status_code == 200, resp.content
    (bucket,) = resp.json()["results"]
    got = [r for r in m.REASONS if bucket[r]]
    assert [bucket[r] for r in got] == [1], bucket
    return got[0], bucket


def test_hit_when_cached_tokens_cover_the_prefix(fleet, gateway, viewer):
    a, _ = fleet
    a.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    post(gateway, cached=64)
    reason, bucket = reason_of(viewer)
    assert reason == m.HIT
    assert bucket["sol_hits"] == 1 and bucket["cached_tokens"] == 64
    assert bucket["prefix_tokens"] == 64


def test_partial_when_part_of_the_prefix_came_from_cache(fleet, gateway, viewer):
    a, _ = fleet
    a.post("/api/agents/report/", report(2, rows(CHAIN, 2)), format="json")
    post(gateway, cached=32)  # 2 of 4 blocks
    reason, bucket = reason_of(viewer)
    assert reason == m.PARTIAL
    assert bucket["sol_hits"] == 0 and bucket["sol_cached_tokens"] == 32


def test_cold_when_no_engine_holds_the_prefix(fleet, gateway, viewer):
    _, b = fleet
    # node-b holds an unrelated chain: the prefix is resident nowhere.
    b.post("/api/agents/report/", report(2, rows([0x1, 0x2, 0x3])), format="json")
    post(gateway, cached=0)
    reason, bucket = reason_of(viewer)
    assert reason == m.COLD and bucket["sol_hits"] == 0


def test_the_serving_engines_copy_made_by_the_request_itself_does_not_count(fleet, gateway, viewer):
    a, _ = fleet
    # By the time the record arrives, node-a reported the blocks serving the request stored
    # there; it reported 0 cached tokens, so before the request it held nothing: cold.
    a.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    post(gateway, cached=0)
    reason, bucket = reason_of(viewer)
    assert reason == m.COLD and bucket["sol_hits"] == 0


def test_routed_away_when_another_engine_held_the_whole_prefix(fleet, gateway, viewer):
    _, b = fleet
    b.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    post(gateway, cached=0)
    reason, bucket = reason_of(viewer)
    assert reason == m.ROUTED_AWAY
    # At the speed of light it was a hit: node-b held all 4 blocks.
    assert bucket["sol_hits"] == 1 and bucket["sol_cached_tokens"] == 64


def test_variant_when_another_engine_held_only_a_leading_part(fleet, gateway, viewer):
    _, b = fleet
    # node-b holds A B then another chain: the request shares 2 blocks, then differs.
    b.post(
        "/api/agents/report/",
        report(2, rows([CHAIN[0], CHAIN[1], 0xEE, 0xEF])),
        format="json",
    )
    post(gateway, cached=0)
    reason, bucket = reason_of(viewer)
    assert reason == m.VARIANT
    assert bucket["sol_hits"] == 0 and bucket["sol_cached_tokens"] == 32


def test_evicted_when_the_serving_engine_removed_it_in_the_window(fleet, gateway, viewer):
    a, b = fleet
    a.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    gone = [(k, "GPU") for k in HEX]
    a.post("/api/agents/report/", report(3, removed=gone), format="json")
    # Another engine holding it too does not change the reason: the serving engine lost it.
    b.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    post(gateway, cached=0)
    reason, _ = reason_of(viewer)
    assert reason == m.EVICTED


def test_an_old_removal_is_not_an_eviction(fleet, gateway, viewer, settings):
    a, _ = fleet
    a.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    a.post("/api/agents/report/", report(3, removed=[(k, "GPU") for k in HEX]), format="json")
    # The request came after the window the removal counts for: cold, not evicted.
    post(gateway, cached=0, time=time.time() + settings.PREWARM_REMOVALS_KEEP_SECONDS + 60)
    reason, _ = reason_of(viewer)
    assert reason == m.COLD


def test_warming_when_a_copy_to_the_serving_engine_was_in_flight(fleet, gateway, viewer):
    _, b = fleet
    b.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    serving = Engine.objects.get(node__name="node-a")
    source = Engine.objects.get(node__name="node-b")
    ReplicationJob.objects.create(
        source=source, target=serving, prefix_keys=HEX, bytes=4, state="running"
    )
    post(gateway, cached=0)
    reason, bucket = reason_of(viewer)
    assert reason == m.WARMING and bucket["sol_hits"] == 1


def test_reason_is_decided_at_ingest_not_recomputed(fleet, gateway, viewer):
    a, b = fleet
    b.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    post(gateway, cached=0)
    # Residency changes afterwards: node-b evicts, node-a now holds it. The reason stays.
    b.post("/api/agents/report/", report(3, removed=[(k, "GPU") for k in HEX]), format="json")
    a.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    assert reason_of(viewer)[0] == m.ROUTED_AWAY
    summary = viewer.get("/api/misses/").json()
    assert summary["totals"]["reasons"][m.ROUTED_AWAY] == 1


def test_summary_rates_and_routed_vs_delivered(fleet, gateway, viewer):
    a, b = fleet
    a.post("/api/agents/report/", report(2, rows(CHAIN)), format="json")
    post(gateway, cached=64, predicted_cached_tokens=64)  # hit, as routed
    post(gateway, cached=32, predicted_cached_tokens=64)  # partial; router expected 64
    resp = viewer.get("/api/misses/?window=15m&tenant=acme")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    (tenant,) = body["by_tenant"]
    assert tenant["tenant"] == "acme" and tenant["requests"] == 2
    assert tenant["delivered_hit_rate"] == 0.5
    assert tenant["speed_of_light_hit_rate"] == 0.5  # node-b holds nothing
    (engine,) = body["by_engine"]
    assert engine["engine_name"] == "node-a/vllm-0"
    assert engine["predicted_cached_tokens"] == 128
    assert engine["delivered_cached_tokens"] == 96
    assert engine["routed_minus_delivered_tokens"] == 32
    assert body["verdict"]["verdict"] == "insufficient_data"
    assert body["series"]["tenants"][0]["tenant"] == "acme"


def test_records_without_a_serving_engine_get_no_reason(fleet, gateway):
    rec = {"time": time.time(), "model": "m", "tenant": "t", "keys": HEX, "cached_tokens": 0}
    resp = gateway.post("/api/request-records/", {"records": [rec]}, format="json")
    assert resp.status_code == 200
    assert WorkloadKey.objects.filter(tenant="t").exists()
    assert not MissBucket.objects.exists()


def test_bad_filter_and_window_are_400(viewer):
    resp = viewer.get("/api/misses/?window=2y")
    assert resp.status_code == 400 and resp.json()["field"] == "window"
    resp = viewer.get("/api/miss-buckets/?since=notadate")
    assert resp.status_code == 400
    resp = viewer.get("/api/misses/?engine=x")
    assert resp.status_code == 400 and resp.json()["field"] == "engine"


def test_predicted_cached_tokens_is_validated(fleet, gateway):
    rec = {
        "time": time.time(),
        "model": "m",
        "tenant": "t",
        "keys": HEX,
        "cached_tokens": 0,
        "engine": "node-a/vllm-0",
        "predicted_cached_tokens": -1,
    }
    resp = gateway.post("/api/request-records/", {"records": [rec]}, format="json")
    assert resp.status_code == 400
    assert resp.json()["field"] == "records[0].predicted_cached_tokens"
    assert not MissBucket.objects.exists()
