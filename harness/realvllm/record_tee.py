"""A pass-through in front of the control plane for the agents that keeps a copy of the request
records their taps post.

The control plane rolls request records into demand buckets and keeps none of them, so a bench
that wants each request's serving engine, cached tokens and TTFT as the taps measured them puts
this between the agents and the control plane: every HTTP request is forwarded as it came
(method, path, query, headers less hop-by-hop ones, body) and every answer goes back as the
control plane gave it; the body of each ``POST /api/request-records/`` the control plane took
(status 200) is kept. Plain HTTP only: the agents behind it take their jobs by long-poll
(``jobs_transport = "long-poll"``, the socket's documented fallback), whose waits it holds open.

It serves on its own thread and event loop (``start()`` returns its URL).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import aiohttp
from aiohttp import web

RECORDS_PATH = "/api/request-records/"
# Describe one connection, not the request (RFC 9110 7.6.1), or are recomputed for the body sent.
HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
    )
)


class RecordTee:
    def __init__(self, upstream: str, host: str = "127.0.0.1"):
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.url = ""
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    # -- what it kept --------------------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        """Every record the control plane took through this tee, in the order they came."""
        with self._lock:
            return list(self._records)

    def keep(self, body: bytes) -> int:
        """Keep the records of one request-records body; how many."""
        try:
            batch = json.loads(body).get("records")
        except (ValueError, AttributeError):
            return 0
        if not isinstance(batch, list):
            return 0
        rows = [r for r in batch if isinstance(r, dict)]
        with self._lock:
            self._records.extend(rows)
        return len(rows)

    # -- serving -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> str:
        self._thread = threading.Thread(target=self._main, name="record-tee", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the record tee did not start: {self._error}")
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        # No total timeout: the agents' long-polls wait up to 25 s for a job.
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 << 20)

        async def forward(request: web.Request) -> web.Response:
            return await self._forward(session, request)

        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await session.close()

    async def _forward(self, session: aiohttp.ClientSession, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            async with session.request(
                request.method,
                self.upstream + request.rel_url.path_qs,
                data=body,
                headers=headers,
                allow_redirects=False,
            ) as resp:
                data = await resp.read()
                back = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.json_response(
                {"error": {"code": "bad_gateway", "message": f"control plane unreachable: {exc}"}},
                status=502,
            )
        if request.method == "POST" and request.path == RECORDS_PATH and status == 200:
            self.keep(body)
        return web.Response(status=status, body=data, headers=back)
