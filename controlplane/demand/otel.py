"""Served request records as OpenTelemetry spans in the GenAI semantic conventions.

With ``PREWARM_OTEL_EXPORT=true`` every ingested request record that names its serving engine
becomes one span, exported over OTLP (HTTP/protobuf; where to is the SDK's own
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, headers and timeouts
likewise), after the batch commits. The span is the conventions' inference client span
(``{gen_ai.operation.name} {gen_ai.request.model}``, kind CLIENT) as the gateway saw it:
``gen_ai.usage.input_tokens`` (the prompt, cached tokens included, as the conventions count it),
``gen_ai.usage.cache_read.input_tokens`` (vLLM's ``usage.prompt_tokens_details.cached_tokens``),
``gen_ai.response.time_to_first_chunk`` (TTFT, seconds), ``server.address`` / ``server.port``
of the engine's OpenAI endpoint, and Prewarm's own ``prewarm.tenant`` / ``prewarm.engine``.
It starts at the request's arrival and ends at its first token (a record carries no end).

The SDK is the ``otel`` extra (``pip install 'prewarm[otel]'``); it is imported only when the
export is on.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

OPERATIONS = ("chat", "text_completion")  # the conventions' names for the two OpenAI routes
_lock = threading.Lock()
_provider: Any = None


def use_provider(provider: Any) -> None:
    """Export through ``provider`` (a TracerProvider) from now on; tests pass one that keeps
    spans in memory. ``None``: the next export builds the OTLP one again."""
    global _provider
    with _lock:
        _provider = provider


def _tracer():
    global _provider
    with _lock:
        if _provider is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES still apply over this default.
            provider = TracerProvider(resource=Resource.create({"service.name": "prewarm"}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            _provider = provider
        return _provider.get_tracer("prewarm.demand")


def _server(openai_url: str) -> dict[str, Any]:
    if not openai_url:
        return {}
    parts = urlsplit(openai_url)
    if not parts.hostname:
        return {}
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname, "server.port": port}


def span_attributes(rec: dict, engine: dict) -> dict[str, Any]:
    """The span's attributes for one record served by ``engine`` (its ``kind``, ``model``,
    ``endpoints`` and ``ref``, the name the record gave it)."""
    model = rec["model"]
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": rec.get("operation") or "chat",
        "gen_ai.provider.name": engine.get("kind") or "vllm",
        "gen_ai.request.model": model,
        "gen_ai.response.model": engine.get("model") or model,
        "prewarm.tenant": rec["tenant"],
        "prewarm.engine": engine["ref"],
        **_server((engine.get("endpoints") or {}).get("openai") or ""),
    }
    if rec.get("prompt_tokens") is not None:
        attrs["gen_ai.usage.input_tokens"] = int(rec["prompt_tokens"])
    if rec.get("cached_tokens") is not None:
        attrs["gen_ai.usage.cache_read.input_tokens"] = int(rec["cached_tokens"])
    if rec.get("ttft_s") is not None:
        attrs["gen_ai.response.time_to_first_chunk"] = float(rec["ttft_s"])
    return attrs


def _ns(seconds: float) -> int:
    # Whole and fraction apart: a unix time in ns is past a float's exact integers.
    whole = int(seconds)
    return whole * 1_000_000_000 + round((seconds - whole) * 1e9)


def export(records: list[dict], engines: dict[str, dict]) -> int:
    """One CLIENT span per record whose serving engine is in ``engines`` (ref -> engine);
    returns how many were started."""
    from opentelemetry.trace import SpanKind

    tracer = _tracer()
    n = 0
    for rec in records:
        engine = engines.get(str(rec.get("engine") or ""))
        if engine is None:
            continue
        attrs = span_attributes(rec, engine)
        start_ns = _ns(float(rec["time"]))
        span = tracer.start_span(
            f"{attrs['gen_ai.operation.name']} {attrs['gen_ai.request.model']}",
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=start_ns,
        )
        span.end(end_time=start_ns + _ns(float(rec.get("ttft_s") or 0.0)))
        n += 1
    return n
