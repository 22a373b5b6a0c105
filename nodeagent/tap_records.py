"""What the request tap reads from a request and its answer: the tenant by the ``tap_tenant``
rule, the prompt's token ids (from the request or the engine's ``/tokenize``), and the usage and
token events of a server-sent event stream."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import aiohttp

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
OBSERVED_PATHS = (COMPLETIONS, CHAT)

TENANT_MODEL = "model"
TENANT_API_KEY = "api-key"
TENANT_HEADER = "header:"
# An HTTP header name (RFC 9110 token characters).
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def tenant_rule_error(rule: str) -> str:
    """Why ``rule`` is not a valid ``tap_tenant`` ("" when it is)."""
    if rule in (TENANT_MODEL, TENANT_API_KEY):
        return ""
    if rule.startswith(TENANT_HEADER) and _HEADER_NAME.match(rule[len(TENANT_HEADER) :]):
        return ""
    return f"tap_tenant {rule!r} must be model, api-key or header:<Header-Name>"


def tenant_of(rule: str, headers: Any, model: str) -> str:
    """The tenant of a request by the configured rule; the model name when the rule finds none."""
    if rule == TENANT_API_KEY:
        auth = headers.get("Authorization", "")
        key = auth.split(None, 1)[1] if auth.lower().startswith("bearer ") else ""
        # A digest, never the key itself: records are stored and shown.
        return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16] if key else model
    if rule.startswith(TENANT_HEADER):
        return headers.get(rule[len(TENANT_HEADER) :].strip(), "") or model
    return model


@dataclass
class Observed:
    """What the tap saw of one request to an observed path, filled in as the answer passes."""

    path: str
    arrival: float  # unix time
    body: dict[str, Any]
    tenant: str
    started: float  # perf_counter at arrival
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    strip_usage: bool = False
    # Tokens the engine's own KV events said it held of this prompt when it arrived (token-id
    # prompts only): the hit a router reading those events predicts.
    predicted: int | None = None


class Window:
    """What a tap saw of its engine's requests over the last ``seconds``, for the fleet doctor:
    prompts shorter than one block, and requests the engine's events said would hit (at least
    one whole block held) that were served with no cached token."""

    def __init__(self, seconds: float = 600.0):
        self.seconds = seconds
        self.rows: deque[tuple[float, bool, bool, bool]] = deque()
        self.lock = threading.Lock()
        self.last_stored_at = 0.0

    def add(self, at: float, short: bool, predicted_hit: bool, cold: bool, stored: bool) -> None:
        """``stored``: the engine computed at least one whole block of it (new blocks, so a
        BlockStored event)."""
        with self.lock:
            self.rows.append((at, short, predicted_hit, cold))
            if stored:
                self.last_stored_at = at
            self._trim(at)

    def _trim(self, now: float) -> None:
        while self.rows and self.rows[0][0] < now - self.seconds:
            self.rows.popleft()

    def counts(self, now: float) -> dict[str, Any]:
        with self.lock:
            self._trim(now)
            rows = list(self.rows)
        return {
            "window_s": self.seconds,
            "requests": len(rows),
            "short_prompts": sum(r[1] for r in rows),
            "predicted_hits": sum(r[2] for r in rows),
            "predicted_hits_served_cold": sum(r[2] and r[3] for r in rows),
            "last_stored_at": self.last_stored_at or None,
        }


def event_usage(event: bytes) -> dict[str, Any] | None:
    """The usage of an SSE event that carries one (vLLM's final usage chunk), else None."""
    if b'"usage":{' not in event and b'"usage": {' not in event:
        return None
    try:
        data = json.loads(event.partition(b"data:")[2])
    except ValueError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else None


def is_usage_only(event: bytes) -> bool:
    """vLLM's added usage chunk: no choices, only usage."""
    return b'"choices":[]' in event or b'"choices": []' in event


def is_finish(event: bytes) -> bool:
    """A token event that ends its choice (a finish_reason that is not null)."""
    return b'"finish_reason":' in event and b'"finish_reason":null' not in event


def with_fingerprint(event: bytes, usage_event: bytes) -> bytes:
    """``event`` (``data: {...}\\n\\n``) with the usage event's system_fingerprint appended,
    where vLLM writes it when it adds no usage event."""
    try:
        fp = json.loads(usage_event.partition(b"data:")[2]).get("system_fingerprint")
    except (ValueError, AttributeError):
        return event
    body = event.rstrip()
    if fp is None or not body.endswith(b"}") or b'"system_fingerprint"' in body:
        return event
    return body[:-1] + b',"system_fingerprint":' + json.dumps(fp).encode() + b"}\n\n"


def is_done(event: bytes) -> bool:
    return event.strip() in (b"data: [DONE]", b"data:[DONE]")


def body_usage(data: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(data)
    except ValueError:
        return None
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None


def _single_prompt(body: dict[str, Any]) -> Any:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
        return prompt[0]  # a batch of one
    return prompt


def request_token_ids(obs: Observed) -> list[int] | None:
    """A completion's token-id prompt as the request gave it; None for text and chat."""
    if obs.path != COMPLETIONS:
        return None
    prompt = _single_prompt(obs.body)
    if isinstance(prompt, list) and all(type(t) is int and t >= 0 for t in prompt):
        return prompt
    return None


async def tokenize(
    session: aiohttp.ClientSession, upstream: str, obs: Observed
) -> list[int] | None:
    """The engine's ``/tokenize`` of a text prompt or chat messages; None when it gives none
    (a batch of several prompts: usage is summed, no one prompt to key)."""
    body = obs.body
    if obs.path == COMPLETIONS:
        prompt = _single_prompt(body)
        if not isinstance(prompt, str):
            return None
        ask: dict[str, Any] = {"model": body.get("model"), "prompt": prompt}
        if "add_special_tokens" in body:
            ask["add_special_tokens"] = body["add_special_tokens"]
    else:
        ask = {"model": body.get("model"), "messages": body.get("messages")}
        for k in (
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
            "chat_template",
            "chat_template_kwargs",
            "tools",
            "mm_processor_kwargs",
        ):
            if k in body:
                ask[k] = body[k]
    try:
        async with session.post(
            upstream + "/tokenize",
            data=json.dumps(ask).encode(),
            headers={"Content-Type": "application/json"},
        ) as resp:
            if resp.status != 200:
                return None
            got = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    tokens = got.get("tokens") if isinstance(got, dict) else None
    return tokens if isinstance(tokens, list) else None
