"""Served request records leave as OpenTelemetry GenAI spans when the export is on."""

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from controlplane.demand import otel
from controlplane.fleet.models import Engine
from wire import blockhash

from .helpers import report


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.use_provider(provider)
    yield exporter
    otel.use_provider(None)


@pytest.fixture
def served_engine(enrol):
    _, agent = enrol("gpu-node-7")
    rep = report(1, mode="snapshot")
    rep["engines"][0]["endpoints"] = {"openai": "http://10.0.0.7:8000/v1", "metrics": ""}
    assert agent.post("/api/agents/report/", rep, format="json").status_code == 200
    return Engine.objects.get()


def records(engine_ref):
    keys = [blockhash.to_hex(k) for k in blockhash.chain_keys(list(range(64)), 16)]
    base = {"model": "llama3-70b", "tenant": "acme", "keys": keys, "block_size": 16}
    return [
        {
            **base,
            "time": 1764540000.25,
            "prompt_tokens": 18000,
            "cached_tokens": 16384,
            "engine": engine_ref,
            "ttft_s": 0.21,
            "operation": "chat",
        },
        {
            **base,
            "time": 1764540001.5,
            "prompt_tokens": 900,
            "cached_tokens": 0,
            "engine": engine_ref,
            "ttft_s": 1.5,
            "operation": "text_completion",
        },
        # Not served by a known engine (no engine named): demand only, no span.
        {**base, "time": 1764540002.0, "prompt_tokens": 64},
    ]


def test_served_records_become_genai_client_spans(
    gateway, served_engine, spans, settings, django_capture_on_commit_callbacks
):
    settings.PREWARM_OTEL_EXPORT = True
    with django_capture_on_commit_callbacks(execute=True):
        resp = gateway.post(
            "/api/request-records/", {"records": records("gpu-node-7/vllm-0")}, format="json"
        )
    assert resp.status_code == 200, resp.content
    got = sorted(spans.get_finished_spans(), key=lambda s: s.start_time)
    assert [s.name for s in got] == ["chat llama3-70b", "text_completion llama3-70b"]
    assert all(s.kind == SpanKind.CLIENT for s in got)
    assert dict(got[0].attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "llama3-70b",
        "gen_ai.response.model": "llama3-70b",
        "gen_ai.usage.input_tokens": 18000,
        "gen_ai.usage.cache_read.input_tokens": 16384,
        "gen_ai.response.time_to_first_chunk": 0.21,
        "server.address": "10.0.0.7",
        "server.port": 8000,
        "prewarm.tenant": "acme",
        "prewarm.engine": "gpu-node-7/vllm-0",
    }
    assert got[1].attributes["gen_ai.usage.cache_read.input_tokens"] == 0
    assert got[1].attributes["gen_ai.usage.input_tokens"] == 900
    # From arrival to first token.
    assert got[0].start_time == 1764540000250000000
    assert got[0].end_time - got[0].start_time == 210_000_000


def test_engine_named_by_id_and_export_off(
    gateway, served_engine, spans, settings, django_capture_on_commit_callbacks
):
    settings.PREWARM_OTEL_EXPORT = False
    with django_capture_on_commit_callbacks(execute=True):
        gateway.post(
            "/api/request-records/", {"records": records(str(served_engine.pk))}, format="json"
        )
    assert spans.get_finished_spans() == ()
    settings.PREWARM_OTEL_EXPORT = True
    with django_capture_on_commit_callbacks(execute=True):
        gateway.post(
            "/api/request-records/", {"records": records(str(served_engine.pk))}, format="json"
        )
    got = spans.get_finished_spans()
    assert len(got) == 2
    assert {s.attributes["prewarm.engine"] for s in got} == {str(served_engine.pk)}


def test_a_record_without_operation_is_a_chat():
    engine = {"ref": "n/e", "kind": "sglang", "model": "", "endpoints": {}}
    rec = {"model": "m", "tenant": "t", "time": 1.0}
    attrs = otel.span_attributes(rec, engine)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "sglang"
    assert "server.address" not in attrs and "gen_ai.usage.input_tokens" not in attrs
    https = otel.span_attributes(rec, {**engine, "endpoints": {"openai": "https://vllm.svc/v1"}})
    assert (https["server.address"], https["server.port"]) == ("vllm.svc", 443)
