"""bench/load.py's traffic: one step of simulated agents, gateways and dashboard websockets
against the web processes, its latencies, and what broke it."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import httpx
import websockets
from _common import percentile
from ingest import Agent

REPORT_P99_MS, BROWSER_P99_MS = 100.0, 250.0
RECORDS_PER_BATCH = 50


def records(rng: random.Random) -> bytes:
    now = time.time()
    return json.dumps(
        {
            "records": [
                {
                    "time": now,
                    "model": "llama3-70b",
                    "tenant": f"t{rng.randrange(8)}",
                    "block_size": 16,
                    "keys": [f"{(rng.randrange(16) << 8) + b:016x}" for b in range(8)],
                }
                for _ in range(RECORDS_PER_BATCH)
            ]
        }
    ).encode()


async def step(
    urls: list[str],
    agents: list[Agent],
    gateways: int,
    dashboards: int,
    seconds: float,
    session: str,
    gateway_token: str,
) -> dict:
    lat = {"report": [], "records": [], "browser": []}
    counts = {"reports_ok": 0, "errors": 0, "records": 0}
    errors: list[str] = []
    stop = asyncio.Event()
    clients = [
        httpx.AsyncClient(
            base_url=u, timeout=10, limits=httpx.Limits(max_connections=len(agents) + 8)
        )
        for u in urls
    ]

    async def post(client, path, body, token, ctype, kind) -> bool:
        t0 = time.perf_counter()
        try:
            resp = await client.post(
                path,
                content=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": ctype},
            )
        except httpx.HTTPError as exc:
            counts["errors"] += 1
            errors.append(f"{kind}: {exc!r}")
            return False
        lat[kind].append(time.perf_counter() - t0)
        if resp.status_code != 200:
            counts["errors"] += 1
            errors.append(f"{kind}: {resp.status_code} {resp.text[:120]}")
            return False
        return True

    async def agent(i: int, a: Agent):
        await asyncio.sleep(i / len(agents))  # spread over the second, like real agents
        nxt = time.perf_counter()
        while not stop.is_set():
            if await post(
                clients[i % len(urls)],
                "/api/agents/report/",
                a.next_body(200),
                a.token,
                "application/msgpack",
                "report",
            ):
                counts["reports_ok"] += 1
            nxt += 1.0
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))

    async def gateway(i: int):
        rng = random.Random(i)
        await asyncio.sleep(rng.random())
        while not stop.is_set():
            if await post(
                clients[i % len(urls)],
                "/api/request-records/",
                records(rng),
                gateway_token,
                "application/json",
                "records",
            ):
                counts["records"] += RECORDS_PER_BATCH
            await asyncio.sleep(1.0)

    async def dashboard(i: int, ready: asyncio.Event):
        url = urls[i % len(urls)]
        headers = {"Cookie": f"sessionid={session}", "Origin": url}
        try:
            async with websockets.connect(
                url.replace("http", "ws") + "/ws/dashboard/",
                additional_headers=headers,
                open_timeout=20,
            ) as ws:
                await ws.recv()  # the snapshot
                ready.set()
                while not stop.is_set():
                    try:
                        msg = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                    except TimeoutError:
                        continue
                    if isinstance(msg.get("at"), (int, float)):
                        lat["browser"].append(time.time() - msg["at"])
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            counts["errors"] += 1
            errors.append(f"dashboard: {exc!r}")
            ready.set()

    readies = [asyncio.Event() for _ in range(dashboards)]
    socks = [asyncio.create_task(dashboard(i, readies[i])) for i in range(dashboards)]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    work = [asyncio.create_task(agent(i, a)) for i, a in enumerate(agents)]
    work += [asyncio.create_task(gateway(i)) for i in range(gateways)]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*work)
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(0.6)
    await asyncio.gather(*socks)
    for c in clients:
        await c.aclose()
    ms = {k: round(percentile(v, 99) * 1000, 1) if v else None for k, v in lat.items()}
    return {
        "agents": len(agents),
        "gateways": gateways,
        "dashboards": dashboards,
        "dashboards_per_web": round(dashboards / len(urls), 1),
        "reports_per_s": round(counts["reports_ok"] / elapsed, 1),
        "records_per_s": round(counts["records"] / elapsed, 1),
        "report_p99_ms": ms["report"],
        "records_p99_ms": ms["records"],
        "browser_p99_ms": ms["browser"],
        "browser_updates": len(lat["browser"]),
        "errors": counts["errors"],
        "first_errors": errors[:3],
        "reports_ok": counts["reports_ok"],
        "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


def broken(r: dict) -> str | None:
    if r["errors"]:
        return f"errors ({r['first_errors'][0]})"
    if r["report_p99_ms"] is not None and r["report_p99_ms"] >= REPORT_P99_MS:
        return f"report p99 {r['report_p99_ms']} ms >= {REPORT_P99_MS:.0f}"
    if r["browser_p99_ms"] is not None and r["browser_p99_ms"] >= BROWSER_P99_MS:
        return f"browser update p99 {r['browser_p99_ms']} ms >= {BROWSER_P99_MS:.0f}"
    return None
