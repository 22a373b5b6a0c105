"""A signed-in dashboard websocket on the end-to-end cluster, recording what it is pushed."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import websockets

from harness.e2e.cluster import Cluster


class DashboardClient:
    """A session-authenticated ``ws/dashboard/`` client in its own thread; reconnects when the
    control plane goes away, records every message with its arrival time."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.cookie = cluster.login_cookie()
        self.messages: list[tuple[float, dict]] = []
        self.connects = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        url = self.cluster.url.replace("http", "ws", 1) + "/ws/dashboard/"
        headers = {"Cookie": self.cookie, "Origin": self.cluster.url}
        while not self._stop.is_set():
            try:
                async with websockets.connect(
                    url, additional_headers=headers, open_timeout=5
                ) as ws:
                    self.connects += 1
                    while not self._stop.is_set():
                        try:
                            raw = await asyncio.wait_for(ws.recv(), 0.5)
                        except TimeoutError:
                            continue
                        self.messages.append((time.time(), json.loads(raw)))
            except (OSError, websockets.WebSocketException, TimeoutError):
                await asyncio.sleep(0.3)

    def seen(self, needle: str, since: float = 0.0) -> bool:
        """Whether a message after ``since`` mentions ``needle`` (a message type or a value)."""
        return any(needle in json.dumps(m) for t, m in self.messages if t >= since)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
