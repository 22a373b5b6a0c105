"""The request tap: an OpenAI-compatible port in front of one engine that turns what it forwards
into request records.

Every request is forwarded to the engine's ``openai_url`` as it came (method, path, query,
headers less hop-by-hop ones, body) and every answer goes back as the engine gave it, status and
body included, streamed event by event. Two changes, both undone on the way back:

- a streaming ``/v1/completions`` or ``/v1/chat/completions`` request that did not ask for usage
  gets ``stream_options.include_usage`` (vLLM reports cached tokens only there), and the usage
  event that this adds is not passed on;
- nothing else: prompt token ids come from the request itself (a token-id prompt) or, for text
  and chat, from the engine's ``/tokenize`` after the answer has gone (``return_token_ids`` would
  change the answer).

What it observes of a served request (status 200): arrival time, model, tenant (model name, API
key digest or a header, ``tap_tenant``), prompt token ids, ``usage.prompt_tokens`` and
``usage.prompt_tokens_details.cached_tokens``, and the time to first token, taken when the first
event carrying a token was written to the client (for a non-streaming answer, when its body was).
The record goes to ``sink``, which only appends to memory: the request never waits on the
control plane (``nodeagent.records`` spools and sends them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from nodeagent.tap_records import (
    CHAT,
    COMPLETIONS,
    OBSERVED_PATHS,
    TENANT_API_KEY,
    TENANT_HEADER,
    TENANT_MODEL,
    Observed,
    Window,
    body_usage,
    event_usage,
    is_done,
    is_finish,
    is_usage_only,
    request_token_ids,
    tenant_of,
    tenant_rule_error,
    tokenize,
    with_fingerprint,
)
from wire import blockhash

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "HOP_BY_HOP",
    "OBSERVED_PATHS",
    "TENANT_API_KEY",
    "TENANT_HEADER",
    "TENANT_MODEL",
    "Observed",
    "RequestTap",
    "TapThread",
    "request_token_ids",
    "tenant_of",
    "tenant_rule_error",
    "tokenize",
]

log = logging.getLogger(__name__)

# Never forwarded: they describe one connection, not the request (RFC 9110 7.6.1), or are
# recomputed for the body actually sent.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)


class RequestTap:
    """One engine's tap: ``start()`` serves ``listen``; records go to ``sink``."""

    def __init__(
        self,
        engine: str,
        listen: str,
        upstream: str,
        emit: Callable[[dict[str, Any]], None],
        block_size: int,
        tenant_rule: str = TENANT_MODEL,
        timeout_s: float = 3600.0,
        token_ids_every_s: float = 10.0,
        predict: Callable[[list[int]], int] | None = None,
    ):
        self.engine = engine  # as records name it: "node/engine_id"
        self.listen = listen
        self.upstream = upstream.rstrip("/")
        self.emit = emit
        self.block_size = block_size
        self.tenant_rule = tenant_rule
        self.timeout_s = timeout_s
        self.token_ids_every_s = token_ids_every_s
        # The leading blocks of a chain the engine's KV events say it holds (the agent's
        # residency of this engine); None: no prediction.
        self.predict = predict
        self.window = Window()
        self._token_ids_sent: dict[tuple[str, str, int], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None
        self.address = ""
        self.forwarded = 0
        self.observed = 0
        self.upstream_errors = 0

    async def start(self) -> str:
        """Serve ``listen`` (port 0 picks one); returns the bound host:port."""
        # No total timeout: a long generation is the client's business; a dead engine is not.
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.timeout_s),
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        host, _, port = self.listen.rpartition(":")
        site = web.TCPSite(self.runner, host or None, int(port), reuse_address=True)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        bound = sock.getsockname()
        self.address = f"{bound[0]}:{bound[1]}"
        log.info("request tap for %s on %s -> %s", self.engine, self.address, self.upstream)
        return self.address

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.runner:
            await self.runner.cleanup()
        if self.session:
            await self.session.close()

    # -- forwarding -------------------------------------------------------------------------
    def _observe(self, request: web.Request, raw: bytes) -> tuple[Observed | None, bytes]:
        """The request to observe (None: forwarded blind) and the body to send."""
        if request.method != "POST" or request.path not in OBSERVED_PATHS:
            return None, raw
        try:
            body = json.loads(raw)
        except ValueError:
            return None, raw
        if not isinstance(body, dict):
            return None, raw
        model = str(body.get("model") or "")
        obs = Observed(
            request.path,
            time.time(),
            body,
            tenant_of(self.tenant_rule, request.headers, model),
            time.perf_counter(),
        )
        if body.get("stream") is True:
            opts = body.get("stream_options")
            if not (isinstance(opts, dict) and opts.get("include_usage")):
                obs.strip_usage = True
                if opts is None and raw.lstrip().startswith(b"{"):
                    # Spliced in, not re-encoded: the rest of the body stays byte for byte.
                    at = raw.index(b"{") + 1
                    raw = raw[:at] + b'"stream_options":{"include_usage":true},' + raw[at:]
                else:
                    sent = dict(body)
                    sent["stream_options"] = {**(opts if isinstance(opts, dict) else {})}
                    sent["stream_options"]["include_usage"] = True
                    raw = json.dumps(sent).encode()
        return obs, raw

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        raw = await request.read()
        obs, body = self._observe(request, raw)
        if obs is not None and self.predict is not None:
            obs.predicted = self._predicted(obs)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = self.upstream + request.rel_url.path_qs
        self.forwarded += 1
        try:
            upstream = await self.session.request(
                request.method, url, data=body, headers=headers, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.upstream_errors += 1
            return web.json_response(
                {"error": {"message": f"engine unreachable: {exc}", "type": "BadGateway"}},
                status=502,
            )
        async with upstream:
            back = CIMultiDict(
                (k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
            )
            out: web.StreamResponse
            streaming = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            if not streaming:
                data = await upstream.read()
                if obs and upstream.status == 200:
                    obs.usage = body_usage(data)
                # One write, headers and body together.
                out = web.Response(
                    status=upstream.status, reason=upstream.reason, body=data, headers=back
                )
                await out.prepare(request)
                await out.write_eof()
                if obs and upstream.status == 200:
                    obs.ttft_s = time.perf_counter() - obs.started
            else:
                out = web.StreamResponse(
                    status=upstream.status, reason=upstream.reason, headers=back
                )
                await out.prepare(request)
                await self._relay_events(upstream, out, obs if upstream.status == 200 else None)
                await out.write_eof()
        if obs and upstream.status == 200 and obs.ttft_s is not None:
            self.observed += 1
            tokens = request_token_ids(obs)
            if tokens is not None:
                self.emit(self.record(obs, tokens))
            else:  # text or chat: the engine tokenizes it, after the answer has gone
                task = asyncio.create_task(self._tokenized(obs))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        return out

    def _predicted(self, obs: Observed) -> int | None:
        tokens = request_token_ids(obs)
        if not tokens or self.predict is None:
            return None
        salt = obs.body.get("cache_salt")
        keys = blockhash.request_keys(
            tokens, self.block_size, cache_salt=salt if isinstance(salt, str) else None
        )
        return self.predict(keys) * self.block_size

    async def _tokenized(self, obs: Observed) -> None:
        assert self.session is not None
        try:
            tokens = await tokenize(self.session, self.upstream, obs)
        except Exception:  # a record is worth less than the tap: log, keep serving
            log.exception("tokenizing a prompt for its record failed")
            tokens = None
        self.emit(self.record(obs, tokens))

    def record(self, obs: Observed, tokens: list[int] | None) -> dict[str, Any]:
        """The request record (docs/api.md) of one served request."""
        body = obs.body
        model = str(body.get("model") or "")
        rec: dict[str, Any] = {
            "time": obs.arrival,
            "model": model,
            "tenant": obs.tenant or model or "default",
            "engine": self.engine,
            "ttft_s": round(obs.ttft_s or 0.0, 6),
            "block_size": self.block_size,
        }
        usage = obs.usage or {}
        prompt_tokens = usage.get("prompt_tokens")
        if type(prompt_tokens) is int:
            rec["prompt_tokens"] = prompt_tokens
            if tokens is not None and len(tokens) != prompt_tokens:
                tokens = None  # not what the engine served (a template differs): no keys
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if type(cached) is int:
            rec["cached_tokens"] = cached
        if obs.predicted is not None:
            rec["predicted_cached_tokens"] = obs.predicted
        if type(prompt_tokens) is int and type(cached) is int:
            self.window.add(
                obs.arrival,
                prompt_tokens < self.block_size,
                (obs.predicted or 0) >= self.block_size,
                cached == 0,
                prompt_tokens // self.block_size > cached // self.block_size,
            )
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        keys = blockhash.request_keys(tokens or [], self.block_size, cache_salt=salt)
        if (
            tokens
            and keys
            and not salt  # the control plane keys token ids without a salt
            and self._send_token_ids(rec["tenant"], model, keys[0], obs.arrival)
        ):
            # Token ids now and then (one record per prefix every ``token_ids_every_s``):
            # executors that address KV by tokens (warmup, lmcache) need them; keys otherwise.
            rec["token_ids"] = tokens
        else:
            rec["keys"] = [blockhash.to_hex(k) for k in keys]
        return rec

    def _send_token_ids(self, tenant: str, model: str, first: int, now: float) -> bool:
        seen = self._token_ids_sent
        last = seen.get((tenant, model, first))
        if last is not None and now - last < self.token_ids_every_s:
            return False
        if len(seen) > 100_000:
            seen.clear()
        seen[(tenant, model, first)] = now
        return True

    async def _relay_events(
        self, upstream: aiohttp.ClientResponse, out: web.StreamResponse, obs: Observed | None
    ) -> None:
        """Pass SSE events on as they complete; note the first token and the usage.

        Where the tap added ``include_usage``, vLLM moves ``system_fingerprint`` from the last
        token event to the usage event it adds; that event is held back until the usage event
        comes (right after it) and gets the fingerprint back, so the client sees the stream it
        would have seen."""
        pending = b""
        held: list[bytes] = []
        async for chunk in upstream.content.iter_any():
            if obs is None:
                await out.write(chunk)
                continue
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            send = []
            for ev in events:
                usage = event_usage(ev)
                if usage is not None:
                    obs.usage = usage
                    if obs.strip_usage and is_usage_only(ev):
                        if held:
                            held[-1] = with_fingerprint(held[-1], ev)
                        continue
                if obs.strip_usage and is_finish(ev):
                    send.extend(held)
                    held = [ev + b"\n\n"]
                    continue
                send.extend(held)
                held = []
                send.append(ev + b"\n\n")
            if held and not obs.strip_usage:
                send.extend(held)
                held = []
            if send:
                await out.write(b"".join(send))
                if obs.ttft_s is None and any(not is_done(ev) for ev in send):
                    obs.ttft_s = time.perf_counter() - obs.started
        if held or pending:
            await out.write(b"".join(held) + pending)
            if obs is not None and obs.ttft_s is None:
                obs.ttft_s = time.perf_counter() - obs.started


class TapThread:
    """The agent's taps on an event loop of their own thread: nothing the agent's loop does
    (reports, fsyncs, KV events) sits between a request and its answer."""

    def __init__(self, taps: list[RequestTap]):
        self.taps = taps
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._main, name="request-tap", daemon=True)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start serving; raises what a tap's start raised (a port in use, a bad address)."""
        self.thread.start()
        self._ready.wait(timeout_s)
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            for tap in self.taps:
                await tap.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            await self._close()
            return
        self._ready.set()
        await self._stop.wait()
        await self._close()

    async def _close(self) -> None:
        for tap in self.taps:
            await tap.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._stop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(timeout_s)
