"""Load: simulated agents, gateways and dashboards ramped against real servers until a target breaks.

Each step runs N agents reporting at 1 Hz (200 residency deltas each, 3/4 stored, 1/4 removed),
N/16 gateways posting 50 request records a second and N/4 dashboard websockets (session cookie),
spread over the web processes (daphne on separate ports, no balancer). It stops at the first step
whose report p99 >= 100 ms or browser-update p99 >= 250 ms or that sees an error, and names what
broke. Reports sent with a 200 are counted against ``Node.reports_applied``: nothing may be lost or
duplicated. Bounded: at most len(steps) x step seconds per backend.

Backends: ``embedded`` (SQLite, in-memory channel layer, one web process) and ``services``
(PostgreSQL + Redis, ``--web`` daphne processes and one ``celery -A controlplane.celery worker``).

    python bench/load.py [--quick] [--json PATH] [--backend embedded|services|both] [--web 2]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import websockets
from _common import REPO, parser, percentile, table, write_json
from ingest import PG_URL, REDIS_URL, SECRET, Agent

REPORT_P99_MS, BROWSER_P99_MS = 100.0, 250.0
RECORDS_PER_BATCH = 50


def seed(env: dict, agents: int) -> dict:
    """Schema, a viewer session and enrolment tokens, written into the servers' database."""
    os.environ.update({**env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"})
    import django

    django.setup()
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import Group, User
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command

    from controlplane.accounts.choices import TokenKind
    from controlplane.accounts.models import ApiToken, EnrolmentToken

    call_command("migrate", verbosity=0)
    user = User.objects.create_user(f"load-{uuid.uuid4().hex[:6]}", password=uuid.uuid4().hex)
    user.groups.add(Group.objects.get(name="viewer"))
    session = SessionStore()
    session[SESSION_KEY], session[BACKEND_SESSION_KEY] = (
        str(user.pk),
        "django.contrib.auth.backends.ModelBackend",
    )
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return {
        "session": session.session_key,
        "enrol": [EnrolmentToken.issue()[1] for _ in range(agents)],
        "gateway_token": ApiToken.issue(TokenKind.GATEWAY, "load")[1],
    }


def reports_applied(names: list[str]) -> int:
    from django.db.models import Sum

    from controlplane.fleet.models import Node

    return Node.objects.filter(name__in=names).aggregate(n=Sum("reports_applied"))["n"] or 0


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


def run_backend(
    name: str, quick: bool, web: int, steps: list[int] | None = None, keep_going: bool = False
) -> dict:
    from controlplane.harness.live import LiveControlPlane

    steps = steps or ([8, 16] if quick else [16, 32, 64, 96, 128, 192])
    seconds = 4.0 if quick else 10.0
    with TemporaryDirectory() as tmp:
        env = {
            "DATABASE_URL": "",
            "REDIS_URL": "",
            "LOG_LEVEL": "WARNING",
            "PREWARM_DATA_DIR": tmp,
            # Load is the point here: the throttles are verified by tests/security.
            "PREWARM_THROTTLE_AGENT": "1000000/min",
            "PREWARM_THROTTLE_GATEWAY": "1000000/min",
        }
        workers: list[subprocess.Popen] = []
        if name == "services":
            import psycopg
            import redis

            redis.Redis.from_url(REDIS_URL).flushdb()
            with psycopg.connect(PG_URL.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
                db = PG_URL.rsplit("/", 1)[1]  # PREWARM_BENCH_PG_URL's database, never another
                conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
                conn.execute(f'CREATE DATABASE "{db}"')
            env.update(
                {
                    "DATABASE_URL": PG_URL,
                    "REDIS_URL": REDIS_URL,
                    "SECRET_KEY": SECRET,
                    "ALLOWED_HOSTS": "127.0.0.1,localhost",
                    "PREWARM_SECURE": "false",
                }
            )
        else:
            web = 1  # embedded: the channel layer and residency index live in the one process
        data = seed(env, max(steps))
        servers = [LiveControlPlane(Path(tmp), env=env) for _ in range(web)]
        try:
            for s in servers:
                s.start(60)
            if name == "services":
                workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "celery",
                            "-A",
                            "controlplane.celery",
                            "worker",
                            "-c",
                            "1",
                            "-Q",
                            "default,forecast,plan,dispatch",
                            "--loglevel",
                            "WARNING",
                        ],
                        env={**os.environ, **env},
                        cwd=REPO,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            agents, names, results = [], [], []
            for i, tok in enumerate(data["enrol"]):
                names.append(f"load-{i}")
                resp = httpx.post(
                    f"{servers[0].url}/api/agents/enrol/",
                    json={"enrolment_token": tok, "hostname": names[-1]},
                    timeout=30,
                )
                agents.append(Agent(resp.json()["agent_token"], random.Random(i)))
            first_break, sustained = None, None
            for n in steps:
                r = asyncio.run(
                    step(
                        [s.url for s in servers],
                        agents[:n],
                        max(1, n // 16),
                        max(1, n // 4),
                        seconds,
                        data["session"],
                        data["gateway_token"],
                    )
                )
                results.append(r)
                why = broken(r)
                print(
                    f"  {name}: {n} agents -> report p99 {r['report_p99_ms']} ms, browser p99 "
                    f"{r['browser_p99_ms']} ms, errors {r['errors']}, load {r['load_avg_1m']}",
                    flush=True,
                )
                if why:
                    r["broke"] = why
                    first_break = first_break or f"at {n} agents: {why}"
                    if not keep_going:
                        break
                    continue
                if not first_break:
                    sustained = r
            sent_ok = sum(
                r["reports_ok"] for r in results
            )  # each agent's first report is its snapshot
            applied = reports_applied(names)
        finally:
            if any(r["errors"] for r in results or []):
                log_text = (Path(tmp) / "daphne.log").read_text()
                at = log_text.find("Traceback")
                print(
                    f"--- first server error:\n{log_text[at : at + 2500] if at >= 0 else log_text[-1500:]}"
                )
            for w in workers:
                w.terminate()
                w.wait(20)
            for s in servers:
                s.close()
    return {
        "backend": name,
        "web_processes": web,
        "worker_processes": len(workers),
        "steps": results,
        "sustained": sustained,
        "first_break": first_break or f"nothing up to {steps[-1]} agents",
        "reports_sent_ok": sent_ok,
        "reports_applied": applied,
    }


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["embedded", "services", "both"], default="both")
    p.add_argument("--web", type=int, default=2, help="web processes for the services backend")
    p.add_argument("--steps", help="agent counts to run, e.g. 64,128 (default: a ramp)")
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="run every step even after one breaks a target (to measure a given size)",
    )
    args = p.parse_args()
    steps = [int(x) for x in args.steps.split(",")] if args.steps else None
    if args.backend == "both":  # one process per backend: Django is set up once per process
        out = {}
        for b in ("embedded", "services"):
            with TemporaryDirectory() as tmp:
                cmd = (
                    [
                        sys.executable,
                        __file__,
                        "--backend",
                        b,
                        "--web",
                        str(args.web),
                        "--json",
                        f"{tmp}/r.json",
                    ]
                    + (["--quick"] if args.quick else [])
                    + (["--steps", args.steps] if args.steps else [])
                    + (["--keep-going"] if args.keep_going else [])
                )
                subprocess.run(cmd, cwd=REPO)  # a non-zero exit (lost reports) is reported below
                if not Path(f"{tmp}/r.json").exists():
                    out[b] = {"error": "run failed (see above; PostgreSQL/Redis missing?)"}
                    continue
                out[b] = json.loads(Path(f"{tmp}/r.json").read_text())[b]
    else:
        out = {
            args.backend: run_backend(args.backend, args.quick, args.web, steps, args.keep_going)
        }
    rows = []
    for b, r in out.items():
        s = r.get("sustained") or {}
        rows.append(
            (
                b,
                str(r.get("web_processes", "-")),
                str(s.get("agents", 0)),
                str(s.get("reports_per_s", "-")),
                str(s.get("records_per_s", "-")),
                str(s.get("dashboards_per_web", "-")),
                str(s.get("report_p99_ms", "-")),
                str(s.get("browser_p99_ms", "-")),
                f"{r.get('reports_sent_ok', '-')}/{r.get('reports_applied', '-')}",
                r.get("first_break", r.get("error", "")),
            )
        )
    print(
        table(
            rows,
            (
                "backend",
                "web",
                "agents",
                "reports/s",
                "records/s",
                "dash/web",
                "report p99 ms",
                "browser p99 ms",
                "sent/applied",
                "what broke first",
            ),
        )
    )
    print(
        f"targets: report p99 < {REPORT_P99_MS:.0f} ms, browser update p99 < {BROWSER_P99_MS:.0f} ms; "
        "baseline: the first step (lightest load) of the same run"
    )
    write_json(args.json, out)
    lost = [
        b
        for b, r in out.items()
        if "reports_applied" in r and r["reports_applied"] != r["reports_sent_ok"]
    ]
    if lost:
        print(f"LOST OR DUPLICATED REPORTS: {lost}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
