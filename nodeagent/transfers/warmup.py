"""``warmup`` executor: place a prefix on a real vLLM engine with a prefill-only request.

vLLM has no "push this prefix to engine B" call. What an outside controller can do is send B a
request whose prompt is the prefix, as token ids, asking for one token: B computes the prefix's
KV (or, with the offloading connector's peer tier and ``kv_transfer_params.remote_kv_source``,
pulls it from the source engine's CPU tier) and keeps it in its prefix cache. B's own KV events
(``BlockStored``) then reach the residency index through this agent's reports, and that is what
confirms the copy on the control plane: this executor only says the copy *landed*.

Request (target agent -> its engine's ``openai_url``)::

    POST /v1/completions {"model": <served_model_name or model>, "prompt": [token ids],
                          "max_tokens": 1, "temperature": 0, "stream": false,
                          ["kv_transfer_params": {"remote_kv_source": {"kv_request_id": <job id>,
                              "remote_host": <source host>, "remote_port": <source port>}}]}

The pull form is used when the target engine is configured with ``warmup_pull = true`` and the
source engine reports a ``kv_peer`` endpoint. The result carries ``prompt_tokens`` and
``cached_tokens`` from the reply's ``usage`` (vLLM reports cached tokens with
``--enable-prompt-tokens-details``) and ``bytes`` = 0 for a recompute: no KV crossed a link.
The source agent has nothing to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from nodeagent.blockstore import BlockStore
from nodeagent.config import EngineConfig
from nodeagent.transfers.base import Job, Progress, TransferResult
from wire import protocol

NAME = protocol.TRANSPORT_WARMUP


class WarmupTransport:
    name = NAME

    def __init__(
        self, engines: Mapping[str, EngineConfig], transport: httpx.BaseTransport | None = None
    ):
        self.engines = engines
        self.transport = transport  # tests may hand in a mock transport

    def send(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        return TransferResult(True, extra={"executor": NAME})

    def request_body(self, job: Job, engine: EngineConfig) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": engine.served_model_name or engine.model,
            "prompt": list(job.tokens),
            "max_tokens": 1,
            "temperature": 0,
            "stream": False,
        }
        peer = str(job.source.get("kv_peer") or "")
        if engine.warmup_pull and peer:
            host, _, port = peer.rpartition(":")
            body["kv_transfer_params"] = {
                "remote_kv_source": {
                    "kv_request_id": f"prewarm-{job.id}-{job.attempt}",
                    "remote_host": host,
                    "remote_port": int(port),
                }
            }
        return body

    def receive(self, job: Job, store: BlockStore, progress: Progress) -> TransferResult:
        engine_id = str(job.target.get("engine_id") or "")
        engine = self.engines.get(engine_id)
        if engine is None:
            return TransferResult.failed(
                NAME, f"warmup: engine {engine_id!r} is not configured on this agent"
            )
        if not engine.openai_url:
            return TransferResult.failed(
                NAME,
                f"warmup: engine {engine_id} has no openai_url configured (its "
                "OpenAI-compatible endpoint), so no warm-up request can reach it",
            )
        if not job.tokens:
            return TransferResult.failed(
                NAME,
                "warmup: the job carries no token ids for the prefix (a gateway must "
                "send token_ids for this workload key)",
            )
        body = self.request_body(job, engine)
        url = engine.openai_url.rstrip("/") + "/v1/completions"
        timeout = max(1.0, min(engine.warmup_timeout_s, job.seconds_left()))
        try:
            with httpx.Client(timeout=timeout, transport=self.transport) as client:
                resp = client.post(url, json=body)
        except httpx.HTTPError as exc:
            return TransferResult.failed(
                NAME, f"warmup: {url} did not answer: {type(exc).__name__}: {exc}"
            )
        if resp.status_code != 200:
            return TransferResult.failed(
                NAME, f"warmup: {url} answered HTTP {resp.status_code}: {resp.text[:300]}"
            )
        try:
            usage = resp.json().get("usage") or {}
            prompt = int(usage.get("prompt_tokens") or 0)
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        except (ValueError, TypeError, AttributeError) as exc:
            return TransferResult.failed(
                NAME, f"warmup: {url} answered 200 but not a completion: {exc}"
            )
        if prompt and prompt != len(job.tokens):
            return TransferResult.failed(
                NAME,
                f"warmup: the engine counted {prompt} prompt tokens for a prefix of "
                f"{len(job.tokens)} (wrong model or tokenizer settings?)",
            )
        pulled = "kv_transfer_params" in body
        detail = (
            f"prefilled {len(job.tokens)} tokens on {engine_id} "
            f"({cached} already cached{', pull from ' + str(job.source.get('kv_peer')) if pulled else ''})"
        )
        return TransferResult(
            True,
            0,
            extra={
                "executor": NAME,
                "prompt_tokens": prompt or len(job.tokens),
                "cached_tokens": cached,
                "detail": detail,
            },
        )
