"""Gateways post request records; they become workload keys and demand buckets."""

import json

from controlplane.core.traces.paths import shared_data_dir
from controlplane.demand.models import DemandBucket, WorkloadKey
from controlplane.fleet.models import Engine
from wire import blockhash

from .helpers import report

SHARED = shared_data_dir()


def mooncake_records(n=200):
    """The first requests of the real Mooncake trace, as a gateway would post them."""
    rows = []
    with open(SHARED / "traces/mooncake/conversation_trace.jsonl") as f:
        for line in f:
            r = json.loads(line)
            rows.append(
                {
                    "time": 1764540000 + r["timestamp"] / 1000,
                    "model": "kimi",
                    "tenant": "chat",
                    "keys": [blockhash.to_hex(h) for h in r["hash_ids"]],
                    "block_size": 512,
                    "prompt_tokens": r["input_length"],
                }
            )
            if len(rows) == n:
                break
    return rows


def test_real_trace_rolls_into_buckets_and_groups(gateway, settings):
    records = mooncake_records()
    resp = gateway.post("/api/request-records/", {"records": records}, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["accepted"] == len(records)
    assert sum(DemandBucket.objects.values_list("requests", flat=True)) == len(records)
    assert sum(DemandBucket.objects.values_list("prompt_tokens", flat=True)) == sum(
        r["prompt_tokens"] for r in records
    )
    # 1024-token groups over 512-token blocks: the group is named by each request's second block.
    groups = {r["keys"][min(2, len(r["keys"])) - 1] for r in records}
    assert WorkloadKey.objects.exclude(prefix_group="*").count() == min(len(groups), 64)
    for wk in WorkloadKey.objects.exclude(prefix_group="*"):
        members = [r for r in records if r["keys"][min(2, len(r["keys"])) - 1] == wk.prefix_group]
        if members:  # the stored chain is what every member shares
            assert all(r["keys"][: len(wk.prefix_keys)] == wk.prefix_keys for r in members)


def test_a_later_batch_adds_to_the_buckets_it_lands_in(gateway):
    records = [
        {"time": 1764540000 + i, "model": "m", "tenant": "t", "keys": ["01", "02"]}
        | {"block_size": 16, "prompt_tokens": 40 + i, "cached_tokens": 16}
        for i in range(3)
    ]
    counters = ("requests", "prompt_tokens", "cached_tokens", "gateway_requests")
    for _ in range(2):
        resp = gateway.post("/api/request-records/", {"records": records}, format="json")
        assert resp.status_code == 200, resp.content
    (bucket,) = DemandBucket.objects.values(*counters)
    assert bucket == {
        "requests": 6,
        "prompt_tokens": 2 * (40 + 41 + 42),
        "cached_tokens": 2 * 3 * 16,
        "gateway_requests": 6,
    }


def test_token_ids_hash_like_the_published_function(gateway):
    tokens = list(range(2048))
    rec = {"time": 1764540000, "model": "m", "tenant": "t", "token_ids": tokens, "block_size": 16}
    assert (
        gateway.post("/api/request-records/", {"records": [rec]}, format="json").status_code == 200
    )
    keys = blockhash.chain_keys(tokens, 16)
    wk = WorkloadKey.objects.get()
    assert wk.prefix_group == blockhash.to_hex(keys[1024 // 16 - 1])
    assert wk.prefix_keys == [blockhash.to_hex(k) for k in keys]


def test_one_bad_record_refuses_the_whole_batch(gateway):
    good = {"time": 1764540000, "model": "m", "tenant": "t", "keys": ["01"]}
    for bad, field in [
        ({**good, "keys": ["xyz"]}, "records[1].keys[0]"),
        ({**good, "time": -5}, "records[1].time"),
        ({"time": 1764540000, "model": "m", "tenant": "t"}, "records[1].keys"),
        ({**good, "token_ids": [1, 2]}, "records[1].keys"),
    ]:
        resp = gateway.post("/api/request-records/", {"records": [good, bad]}, format="json")
        assert resp.status_code == 400, resp.content
        assert resp.json()["field"] == field, resp.json()
    assert not DemandBucket.objects.exists() and not WorkloadKey.objects.exists()


def test_batch_over_the_limit_is_413(gateway, settings):
    settings.PREWARM_MAX_RECORDS_PER_BATCH = 3
    rec = {"time": 1764540000, "model": "m", "tenant": "t", "keys": ["01"]}
    resp = gateway.post("/api/request-records/", {"records": [rec] * 4}, format="json")
    assert resp.status_code == 413 and resp.json()["field"] == "records"


def test_lookup_by_token_ids_matches_agent_reported_keys(enrol, gateway):
    tokens = list(range(64))
    keys = blockhash.chain_keys(tokens, 16)
    _, agent = enrol()
    stored = [
        (blockhash.to_hex(k), blockhash.to_hex(keys[i - 1]) if i else None, "GPU")
        for i, k in enumerate(keys[:3])
    ]
    agent.post("/api/agents/report/", report(1, stored, mode="snapshot"), format="json")
    resp = gateway.post(
        "/api/residency/lookup/", {"token_ids": tokens, "block_size": 16}, format="json"
    )
    assert resp.status_code == 200
    holders = resp.json()["holders"]
    assert [(h["engine"], h["depth"], h["tokens"]) for h in holders] == [
        (Engine.objects.get().pk, 3, 48)
    ]


def test_a_batch_that_finds_every_ingest_slot_busy_is_503_and_changes_nothing(gateway, settings):
    """A process parses at most PREWARM_INGEST_CONCURRENCY batches at once: with its one slot
    held, a batch waits PREWARM_INGEST_WAIT_SECONDS, then is answered 503 with Retry-After
    (which agents and gateways send again) and writes nothing; with the slot free it lands."""
    from controlplane.demand import ingest_slots

    settings.PREWARM_INGEST_CONCURRENCY, settings.PREWARM_INGEST_WAIT_SECONDS = 1, 0.05
    rec = {"time": 1764540000, "model": "m", "tenant": "t", "keys": ["01"]}
    held = ingest_slots._semaphore()
    assert held.acquire(timeout=5)
    try:
        resp = gateway.post("/api/request-records/", {"records": [rec]}, format="json")
    finally:
        held.release()
    assert resp.status_code == 503 and resp.json()["error"] == "ingest_busy"
    assert resp["Retry-After"] == "1"
    assert not DemandBucket.objects.exists() and not WorkloadKey.objects.exists()
    resp = gateway.post("/api/request-records/", {"records": [rec]}, format="json")
    assert resp.status_code == 200 and DemandBucket.objects.count() == 1
