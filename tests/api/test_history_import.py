"""Past request history into the demand buckets: ``POST /api/history-imports/`` and
``manage.py import_history`` read JSONL, CSV, vLLM's request log and vllm-router's log into the
same workload keys and buckets that live request records make, all or nothing, once."""

import io
import json
import time
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command

from controlplane.audit.models import AuditEvent
from controlplane.demand import history
from controlplane.demand.models import DemandBucket, HistoryImport, WorkloadKey
from controlplane.demand.services import ingest_records
from wire import blockhash

from .test_request_records import mooncake_records

NOW = time.time()
DAY = 86400.0


def recent(records, ago_s=DAY):
    """The trace's records moved to end ``ago_s`` before now (the import refuses the future)."""
    shift = NOW - ago_s - max(r["time"] for r in records)
    return [{**r, "time": r["time"] + shift} for r in records]


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def buckets():
    return sorted(
        (wk.tenant, wk.model, wk.prefix_group, b.start, b.seconds, b.requests, b.prompt_tokens)
        for b in DemandBucket.objects.select_related("key")
        for wk in [b.key]
    )


def post(client, content, **fields):
    return client.post("/api/history-imports/", {"content": content, **fields}, format="json")


@pytest.fixture
def operator(client_for):
    return client_for("operator")


def test_jsonl_history_fills_the_buckets_live_records_would(operator, settings):
    """The real Mooncake trace imported as JSONL: the same workload keys (prefix groups and
    shared chains) and buckets as the same requests posted live."""
    records = recent(mooncake_records(300))
    resp = post(operator, jsonl(records), format="jsonl", source="kimi-gateway")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["requests"] == body["rows"] == len(records) and body["lines"] == len(records)
    assert body["skipped_live"] == body["skipped_old"] == body["skipped_seen"] == 0
    assert not body["already_imported"] and body["workload_keys_created"] > 1
    imported = buckets()
    chains = {(wk.prefix_group, tuple(wk.prefix_keys)) for wk in WorkloadKey.objects.all()}
    DemandBucket.objects.all().delete()
    WorkloadKey.objects.all().delete()
    ingest_records(records)
    assert imported == buckets()
    assert chains == {(wk.prefix_group, tuple(wk.prefix_keys)) for wk in WorkloadKey.objects.all()}
    ev = AuditEvent.objects.get(action="history.imported")
    assert ev.object_id == str(body["id"]) and ev.actor_label.startswith("user:")


def test_csv_and_spread_counts(operator, settings):
    """CSV with ISO times, counts of requests per row, spread evenly over a window; rows with no
    prefix count under the tenant's catch-all group."""
    settings.PREWARM_DEMAND_BUCKET_SECONDS = 60
    t0 = datetime.fromtimestamp((NOW - DAY) // 3600 * 3600, tz=UTC)
    keys = " ".join(blockhash.to_hex(k) for k in (11, 12, 13))
    content = (
        "time,tenant,model,requests,seconds,prompt_tokens,keys,block_size\n"
        f"{t0.isoformat()},acme,llama,125,600,250000,{keys},512\n"
        f"{t0.isoformat()},beta,llama,3,,900,,\n"
    )
    resp = post(operator, content)  # format auto: a header line is CSV
    assert resp.status_code == 201, resp.content
    assert resp.json()["format"] == "auto" and resp.json()["requests"] == 128
    acme = WorkloadKey.objects.get(tenant="acme")
    assert acme.prefix_group == blockhash.to_hex(12) and acme.prefix_keys == keys.split()
    counts = list(acme.buckets.order_by("start").values_list("requests", flat=True))
    assert len(counts) == 10 and sum(counts) == 125 and set(counts) == {12, 13}
    assert sum(acme.buckets.values_list("prompt_tokens", flat=True)) == 250000
    beta = WorkloadKey.objects.get(tenant="beta")
    assert beta.prefix_group == "*" and beta.buckets.get().requests == 3


@pytest.mark.parametrize("via", ["api", "command"])
def test_a_bad_row_names_its_line_and_leaves_nothing_behind(operator, monkeypatch, tmp_path, via):
    """Rows are written chunk by chunk as they are read; a bad row after a written chunk still
    leaves no bucket, key, import or audit record behind: the import is one transaction (the
    command's own, not only the API request's)."""
    monkeypatch.setattr(history, "CHUNK_ROWS", 2)
    rows = recent(mooncake_records(6))
    lines = jsonl(rows).splitlines()
    lines.insert(5, json.dumps({**rows[0], "prompt_tokens": "many"}))
    content = "\n".join(lines) + "\n"
    if via == "api":
        resp = post(operator, content, format="jsonl")
        assert resp.status_code == 400, resp.content
        err = resp.json()
        assert err["error"] == "bad_history_row" and err["line"] == 6 and err["field"] == "file"
        detail = err["detail"]
    else:
        path = tmp_path / "history.jsonl"
        path.write_text(content)
        with pytest.raises(CommandError) as exc:
            call_command("import_history", str(path))
        detail = str(exc.value)
    assert "line 6" in detail and "prompt_tokens" in detail
    assert not DemandBucket.objects.exists() and not WorkloadKey.objects.exists()
    assert not HistoryImport.objects.exists()
    assert not AuditEvent.objects.filter(action="history.imported").exists()


@pytest.mark.parametrize(
    "line, says",
    [
        ("{not json", "not JSON"),
        ('{"time": "yesterday", "model": "m", "prompt_tokens": 1}', "neither unix seconds"),
        ('{"time": 1, "model": "m", "prompt_tokens": 1, "colour": "red"}', "unknown field"),
        ('{"time": 4102444800, "model": "m", "prompt_tokens": 1}', "in the future"),
        ('{"time": 1790000000, "prompt_tokens": 1}', "no model"),
        ('{"time": 1790000000, "model": "m", "keys": ["xyz"]}', "not a hex key"),
    ],
)
def test_each_bad_row_is_refused_with_its_line(operator, line, says):
    good = json.dumps({"time": NOW - 60, "model": "m", "tenant": "t", "prompt_tokens": 5})
    resp = post(operator, f"{good}\n{line}\n")
    assert resp.status_code == 400 and resp.json()["line"] == 2, resp.content
    assert says in resp.json()["detail"]
    assert not DemandBucket.objects.exists()


def test_the_same_file_imports_once_and_a_grown_log_adds_only_its_tail(operator):
    rows = recent(mooncake_records(40), ago_s=2 * DAY)
    first = post(operator, jsonl(rows[:30]), source="gw-1")
    assert first.status_code == 201
    again = post(operator, jsonl(rows[:30]), source="gw-1")
    assert again.status_code == 200 and again.json()["already_imported"]
    assert again.json()["id"] == first.json()["id"]
    assert sum(DemandBucket.objects.values_list("requests", flat=True)) == 30
    # The same source's log, grown: its first 30 lines are skipped, the tail counted.
    grown = post(operator, jsonl(rows), source="gw-1")
    assert grown.status_code == 201, grown.content
    seen = max(r["time"] for r in rows[:30])
    assert grown.json()["skipped_seen"] == sum(r["time"] <= seen for r in rows) >= 30
    assert grown.json()["requests"] == sum(r["time"] > seen for r in rows) > 0
    total = sum(DemandBucket.objects.values_list("requests", flat=True))
    assert total == 30 + grown.json()["requests"]
    assert HistoryImport.objects.count() == 2


def test_rows_after_a_key_went_live_are_skipped(operator):
    """Once live records count a workload key, history at or after its first one is not added
    again; older history is."""
    live = {"time": NOW - 100, "model": "m", "tenant": "t", "keys": ["0a", "0b"], "block_size": 512}
    ingest_records([live])
    wk = WorkloadKey.objects.get()
    rows = [{**live, "time": t} for t in (NOW - 3 * 3600, NOW - 2 * 3600, NOW - 1)]
    resp = post(operator, jsonl(rows))
    assert resp.status_code == 201, resp.content
    assert resp.json()["requests"] == 2 and resp.json()["skipped_live"] == 1
    assert sum(wk.buckets.values_list("requests", flat=True)) == 3


def test_old_history_goes_into_hourly_buckets_and_past_retention_is_skipped(operator, settings):
    settings.PREWARM_DEMAND_BUCKET_SECONDS = 60
    settings.PREWARM_DEMAND_FINE_DAYS = 14
    settings.PREWARM_DEMAND_DAYS = 90
    base = {"model": "m", "tenant": "t", "prompt_tokens": 10}
    # From the middle of an hour, so the rows 20 and 20.0001 days back (8.6 s apart) share an
    # hourly bucket whatever the clock says (from NOW itself an hour could begin between them).
    mid = NOW // 3600 * 3600 - 1800
    rows = [{**base, "time": mid - d * DAY} for d in (1, 20, 20.0001, 100)]
    resp = post(operator, jsonl(rows))
    assert resp.status_code == 201 and resp.json()["skipped_old"] == 1
    got = sorted(DemandBucket.objects.values_list("seconds", "requests"))
    assert got == [(60, 1), (3600, 2)]


VLLM_LOG = """\
INFO 12-05 09:00:01 [api_server.py:1880] vLLM API server version 0.9.2
INFO 12-05 09:00:05 [logger.py:43] Received request cmpl-a1-0: prompt: 'x', params: SamplingParams(n=1, temperature=0.0, max_tokens=1), prompt_token_ids: {ids_a}, prompt_embeds shape: None, lora_request: None.
INFO:     127.0.0.1:50312 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=7) DEBUG 12-05 09:00:09 [logger.py:39] Request cmpl-b2-0 details: prompt: None, prompt_token_ids: {ids_b}, prompt_embeds shape: None.
(APIServer pid=7) INFO 12-05 09:00:09 [logger.py:48] Received request cmpl-b2-0: params: SamplingParams(n=1, max_tokens=1), lora_request: LoRARequest(lora_name='sql', lora_int_id=1, lora_path='/l').
(APIServer pid=7) INFO 12-05 09:00:10 [logger.py:48] Received request cmpl-c3-0: params: SamplingParams(n=1, max_tokens=1), lora_request: None.
"""


def test_a_vllm_request_log_lands_on_the_keys_the_request_tap_makes(operator):
    """vLLM's ``Received request`` lines (token ids logged there) and the debug ``details``
    lines of newer releases: the chain from the token ids with the engine's block size, the
    time from the line's prefix (no year: given), the tenant the tap would name (the model)."""
    ids = list(range(100, 164))
    log = VLLM_LOG.format(ids_a=ids, ids_b=ids[:48])
    resp = post(operator, log, model="llama", block_size=16, year=2026, source="engine-a")
    assert resp.status_code == 201, resp.content
    assert resp.json()["format"] == "auto" and resp.json()["requests"] == 2
    live = {
        "time": NOW - 5,
        "model": "llama",
        "tenant": "llama",
        "token_ids": ids,
        "block_size": 16,
    }
    assert ingest_records([live])["workload_keys_created"] == 0  # the key the log made
    wk = WorkloadKey.objects.get(prefix_group=blockhash.to_hex(blockhash.chain_keys(ids, 16)[3]))
    first = wk.buckets.order_by("start").first()
    assert first.start == datetime(2026, 12, 5, 9, 0, tzinfo=UTC) and first.prompt_tokens == 64
    # The LoRA request's blocks hash with its adapter: another group.
    assert WorkloadKey.objects.count() == 2


ROUTER_LOG = """\
2026-12-05 09:00:00  INFO vllm_router_rs::server: src/server.rs:120: Starting router on 0.0.0.0:8000
2026-12-05 09:00:02 DEBUG vllm_router_rs::policies::kv_aware: src/policies/kv_aware.rs:210: KV prefix decision outcome="hit" worker="http://e0:8000" input_tokens=1200 new_prefill_tokens=200 credited_prefix_tokens=1000
2026-12-05 09:00:03 DEBUG vllm_router_rs::policies::kv_aware: src/policies/kv_aware.rs:210: KV prefix decision outcome="miss" worker="http://e1:8000" input_tokens=800 new_prefill_tokens=800 credited_prefix_tokens=0
"""


def test_a_vllm_router_log_counts_its_requests_under_the_tenant(operator):
    resp = post(operator, ROUTER_LOG, model="llama", tenant="acme")
    assert resp.status_code == 201, resp.content
    assert resp.json()["format"] == "auto" and resp.json()["requests"] == 2
    wk = WorkloadKey.objects.get()
    assert (wk.tenant, wk.model, wk.prefix_group) == ("acme", "llama", "*")
    assert sum(wk.buckets.values_list("prompt_tokens", flat=True)) == 2000


def test_viewers_read_imports_and_cannot_make_them(client_for, operator):
    assert post(operator, jsonl(recent(mooncake_records(3)))).status_code == 201
    viewer = client_for("viewer")
    assert viewer.get("/api/history-imports/").json()["count"] == 1
    assert post(viewer, jsonl(recent(mooncake_records(4)))).status_code == 403


def test_a_file_upload_and_the_command_import_the_same_way(operator, tmp_path):
    rows = recent(mooncake_records(50))
    upload = io.BytesIO(jsonl(rows[:25]).encode())
    upload.name = "part1.jsonl"
    resp = operator.post("/api/history-imports/", {"file": upload}, format="multipart")
    assert resp.status_code == 201 and resp.json()["filename"] == "part1.jsonl", resp.content
    path = tmp_path / "part2.jsonl"
    path.write_text(jsonl(rows[25:]))
    out = io.StringIO()
    call_command("import_history", str(path), stdout=out)
    assert "25 requests" in out.getvalue()
    out = io.StringIO()
    call_command("import_history", str(path), stdout=out)
    assert "imported before" in out.getvalue()
    assert sum(DemandBucket.objects.values_list("requests", flat=True)) == 50
    labels = AuditEvent.objects.filter(action="history.imported").values_list(
        "actor_label", flat=True
    )
    assert sorted(labels) == ["system", "user:u-operator"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"time": 1}\n')
    with pytest.raises(CommandError, match="line 1"):
        call_command("import_history", str(bad))
