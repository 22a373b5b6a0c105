"""A fast stand-in for vLLM's OpenAI-compatible server, for the request tap's tests and its
benchmark at rates a CPU engine cannot serve.

It answers as vLLM 0.32 does, byte for byte where the tap looks (checked against the real
server in tests/realvllm): compact JSON; ``usage`` with ``prompt_tokens_details.cached_tokens``
(a prompt's full 32-token blocks count as cached from its second time on); streams of
``data: {...}`` events ending ``data: [DONE]``, where ``stream_options.include_usage`` adds a
last event with empty ``choices`` and the usage, and moves ``system_fingerprint`` from the last
token event to it; ``/tokenize`` (one token per word); errors as ``{"error": {...}}`` with
their status (an unknown model: 404; a prompt over ``max_model_len``: 400). ``delay_s`` holds
every answer that long before its first byte (a prefill).
"""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from typing import Any

from aiohttp import web

FINGERPRINT = "vllm-0.32.0-stub"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _word_id(word: str) -> int:
    return 4 + zlib.crc32(word.encode()) % 2044


class OpenAIStub:
    def __init__(
        self,
        model: str = "tiny",
        block_size: int = 32,
        max_model_len: int = 2048,
        delay_s: float = 0.0,
        tokens: int = 3,
    ):
        self.model = model
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.delay_s = delay_s
        self.tokens = tokens
        self.seen: set[tuple[int, ...]] = set()
        self.requests: list[dict[str, Any]] = []  # bodies as received (up to keep)
        self.records_received = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    # -- answers -------------------------------------------------------------------------
    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        if "messages" in body:
            text = " ".join(str(m.get("content", "")) for m in body["messages"])
            return [_word_id(w) for w in text.split()]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        return [_word_id(w) for w in str(prompt).split()]

    def _usage(self, ids: list[int], completion: int) -> dict[str, Any]:
        full = len(ids) // self.block_size * self.block_size
        key = tuple(ids[:full])
        cached = full if key in self.seen and full else 0
        self.seen.add(key)
        return {
            "prompt_tokens": len(ids),
            "total_tokens": len(ids) + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def _error(self, status: int, kind: str, message: str) -> web.Response:
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        return web.Response(status=status, body=_dumps(body), content_type="application/json")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if len(self.requests) < 10_000:
            self.requests.append(body)
        chat = request.path.endswith("/chat/completions")
        if body.get("model") != self.model:
            return self._error(
                404, "NotFoundError", f"The model `{body.get('model')}` does not exist."
            )
        ids = self._prompt_ids(body)
        if len(ids) > self.max_model_len:
            return self._error(400, "BadRequestError", "prompt is longer than max_model_len")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        n = int(body.get("max_tokens") or self.tokens)
        usage = self._usage(ids, n)
        head = {
            "id": "cmpl-stub",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": self.model,
        }
        if not body.get("stream"):
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": " w5" * n}}
            else:
                choice = {"index": 0, "text": " w5" * n}
            choice["finish_reason"] = "length"
            out = {**head, "choices": [choice], "system_fingerprint": FINGERPRINT, "usage": usage}
            return web.Response(body=_dumps(out), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        for i in range(n):
            last = i == n - 1
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": " w5"}} if chat else {"index": 0, "text": " w5"}
            )
            choice["finish_reason"] = "length" if last else None
            event: dict[str, Any] = {**head, "choices": [choice]}
            if last and not with_usage:
                event["system_fingerprint"] = FINGERPRINT
            await resp.write(b"data: " + _dumps(event) + b"\n\n")
        if with_usage:
            event = {**head, "choices": [], "usage": usage, "system_fingerprint": FINGERPRINT}
            await resp.write(b"data: " + _dumps(event) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def tokenize(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        ids = self._prompt_ids(body)
        out = {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids}
        return web.Response(body=_dumps(out), content_type="application/json")

    async def models(self, request: web.Request) -> web.Response:
        out = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        return web.Response(body=_dumps(out), content_type="application/json")

    async def records(self, request: web.Request) -> web.Response:
        """A control plane's records endpoint (the benchmark's taps post here)."""
        n = len(json.loads(await request.read())["records"])
        self.records_received += n
        return web.Response(body=_dumps({"accepted": n}), content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    # -- serving -------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/api/request-records/", self.records)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return self.url

    async def close(self) -> None:
        if self._runner:
            await self._runner.cleanup()


class StubThread:
    """An ``OpenAIStub`` served from a thread of its own (its own event loop)."""

    def __init__(self, stub: OpenAIStub):
        self.stub = stub
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> str:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def main(argv: list[str] | None = None) -> None:
    """Serve a stub on --port until killed (its own process: the tap's benchmark)."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay-s", type=float, default=0.0)
    args = p.parse_args(argv)
    stub = OpenAIStub(delay_s=args.delay_s)

    async def serve() -> None:
        await stub.start(port=args.port)
        print(stub.url, flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
