"""Dashboard latency: agent report -> browser update with 50 dashboards open; cache map first load.

Runs the real server (daphne, Channels, in-memory channel layer, SQLite file) with a 256-engine
cluster (32 nodes x 8 engines) built through the agent API, opens N websocket dashboards with real
sessions, posts agent reports over HTTP and times each until every dashboard has a delta naming
the engine it changed. Baselines in the same run: the report POST alone (what the dashboard path adds to it),
and the cache map payload without its bounds (every engine x the maximum number of prefixes).

    python bench/ui_latency.py [--quick] [--json PATH] [--dashboards 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODES, ENGINES_PER_NODE, PREFIXES, SEEDED_PREFIXES = 32, 8, 24, 96
TARGETS = {"report_to_browser_p99_ms": 250.0, "cache_map_first_load_ms": 1000.0}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def seed(env: dict) -> dict:
    """Users, hot prefixes and enrolled agents, written straight into the server's database."""
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from harness import fleet_seed as cluster

    user = cluster.make_user("viewer", "bench")
    chains = [cluster.chain(i + 1, 8) for i in range(SEEDED_PREFIXES)]
    for i, keys in enumerate(chains):
        cluster.hot_prefix(f"tenant-{i:02d}", keys, requests=1000 - i)
    agents = [(f"node-{n:02d}", cluster.enrol(f"node-{n:02d}")[1]) for n in range(NODES)]
    session = SessionStore()
    session[SESSION_KEY], session[BACKEND_SESSION_KEY] = (
        str(user.pk),
        "django.contrib.auth.backends.ModelBackend",
    )
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return {"chains": chains, "agents": agents, "session": session.session_key}


async def run(url: str, data: dict, dashboards: int, reports: int, gap_s: float) -> dict:
    import httpx
    import websockets

    from harness import fleet_seed as cluster

    chains, agents = data["chains"], data["agents"]
    cookies = {"sessionid": data["session"]}
    seq = {name: 1 for name, _ in agents}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        engine_ids = {}
        for i, (name, token) in enumerate(agents):  # everything resident somewhere: a full map
            rows = {
                f"vllm-{e}": cluster.stored(chains[(i + e) % PREFIXES][: 1 + (i * e) % 8])
                for e in range(ENGINES_PER_NODE)
            }
            body = cluster.report(seq[name], name, ENGINES_PER_NODE, rows, mode="snapshot")
            resp = await http.post(
                "/api/agents/report/", json=body, headers={"Authorization": f"Bearer {token}"}
            )
            resp.raise_for_status()
        # Cache map: first load (page + data, cold), payload at 256 engines, unbounded baseline.
        loads = []
        for _ in range(5):
            t0 = time.perf_counter()
            page = await http.get("/", cookies=cookies)
            cmap = await http.get(f"/api/cache-map/?limit=256&prefixes={PREFIXES}", cookies=cookies)
            loads.append((time.perf_counter() - t0) * 1000)
            assert page.status_code == 200 and cmap.status_code == 200, (
                page.status_code,
                cmap.status_code,
            )
        payload = len(cmap.content)
        full = await http.get("/api/cache-map/?limit=256&prefixes=64", cookies=cookies)
        for engine in cmap.json()["engines"]:
            if engine["name"] == "vllm-0":  # the engine each timed report changes
                engine_ids[engine["node"]] = engine["id"]

        # Dashboards.
        host = url.split("//")[1]
        arrivals: list[list[tuple[float, set]]] = [[] for _ in range(dashboards)]

        async def dashboard(i: int, ready: asyncio.Event, done: asyncio.Event):
            headers = {"Cookie": f"sessionid={data['session']}", "Origin": url}
            async with websockets.connect(
                f"ws://{host}/ws/dashboard/", additional_headers=headers
            ) as ws:
                first = json.loads(await ws.recv())
                assert first["type"] == "snapshot", first
                ready.set()
                while not done.is_set():
                    try:
                        msg = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                    except TimeoutError:
                        continue
                    engines = set(msg.get("residency", {}).get("engines", []))
                    arrivals[i].append((time.perf_counter(), engines))

        done = asyncio.Event()
        readies = [asyncio.Event() for _ in range(dashboards)]
        tasks = [asyncio.create_task(dashboard(i, readies[i], done)) for i in range(dashboards)]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)

        sent, post_ms = [], []
        for r in range(reports):
            name, token = agents[r % NODES]
            seq[name] += 1
            rows = {"vllm-0": cluster.stored(chains[(r + 3) % PREFIXES][:4])}
            body = cluster.report(seq[name], name, ENGINES_PER_NODE, rows, mode="snapshot")
            t0 = time.perf_counter()
            resp = await http.post(
                "/api/agents/report/", json=body, headers={"Authorization": f"Bearer {token}"}
            )
            post_ms.append((time.perf_counter() - t0) * 1000)
            resp.raise_for_status()
            sent.append((t0, engine_ids[name]))
            await asyncio.sleep(gap_s)
        await asyncio.sleep(1.0)
        done.set()
        await asyncio.gather(*tasks)

    latencies, missed = [], 0
    for t0, engine in sent:
        for got in arrivals:
            hit = next((t for t, engines in got if t >= t0 and engine in engines), None)
            if hit is None:
                missed += 1
            else:
                latencies.append((hit - t0) * 1000)
    return {
        "dashboards": dashboards,
        "reports": reports,
        "engines": NODES * ENGINES_PER_NODE,
        "report_to_browser_p50_ms": round(pct(latencies, 50), 1),
        "report_to_browser_p99_ms": round(pct(latencies, 99), 1),
        "deliveries_missed": missed,
        "baseline_report_post_p50_ms": round(pct(post_ms, 50), 1),
        "baseline_report_post_p99_ms": round(pct(post_ms, 99), 1),
        "cache_map_first_load_ms": round(loads[0], 1),
        "cache_map_load_median_ms": round(statistics.median(loads), 1),
        "cache_map_payload_bytes": payload,
        "baseline_unbounded_payload_bytes": len(full.content),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer reports (< 1 minute)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--dashboards", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="prewarm-ui-bench-"))
    env = {
        **os.environ,
        "PREWARM_DATA_DIR": str(tmp),
        "SQLITE_PATH": str(tmp / "db.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "PREWARM_NODE_STALE_SECONDS": "3600",
        "LOG_LEVEL": "WARNING",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    data = seed(env)
    from harness.live import LiveControlPlane

    server = LiveControlPlane(tmp, env=env)  # its log: <tmp>/daphne.log
    try:
        server.start(timeout=60)
        reports = 40 if args.quick else 300
        out = asyncio.run(run(server.url, data, args.dashboards, reports, gap_s=0.1))
    finally:
        server.close()
    out["mode"] = "quick" if args.quick else "full"
    rows = [
        (
            "report -> browser p99 (ms)",
            out["report_to_browser_p99_ms"],
            f"< {TARGETS['report_to_browser_p99_ms']:.0f}",
        ),
        ("report -> browser p50 (ms)", out["report_to_browser_p50_ms"], ""),
        ("baseline: report POST alone p50 (ms)", out["baseline_report_post_p50_ms"], ""),
        ("baseline: report POST alone p99 (ms)", out["baseline_report_post_p99_ms"], ""),
        ("deliveries missed", out["deliveries_missed"], "0"),
        (
            "cache map first load (ms)",
            out["cache_map_first_load_ms"],
            f"< {TARGETS['cache_map_first_load_ms']:.0f}",
        ),
        ("cache map load median (ms)", out["cache_map_load_median_ms"], ""),
        ("cache map payload, 256 engines (bytes)", out["cache_map_payload_bytes"], "bounded"),
        (
            "baseline: 256 engines x 64 prefixes (bytes)",
            out["baseline_unbounded_payload_bytes"],
            "",
        ),
    ]
    print(
        f"ui_latency ({out['mode']}): {out['engines']} engines, {out['dashboards']} dashboards, "
        f"{out['reports']} reports"
    )
    for name, value, target in rows:
        print(f"  {name:<46} {value:>12} {target}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    ok = (
        out["report_to_browser_p99_ms"] < TARGETS["report_to_browser_p99_ms"]
        and out["cache_map_first_load_ms"] < TARGETS["cache_map_first_load_ms"]
        and not out["deliveries_missed"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
