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
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
from _common import REPO, parser, table, write_json
from _load.traffic import BROWSER_P99_MS, REPORT_P99_MS, broken, step
from ingest import PG_URL, REDIS_URL, SECRET, Agent


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


def run_backend(
    name: str, quick: bool, web: int, steps: list[int] | None = None, keep_going: bool = False
) -> dict:
    from harness.live import LiveControlPlane
    from harness.processes import Proc, celery_worker_argv

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
        workers: list[Proc] = []
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
                argv = celery_worker_argv("default,forecast,plan,dispatch", 1, "", "WARNING")
                workers.append(Proc("worker", argv, {**os.environ, **env}, Path(tmp)).start())
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
                w.stop(20, leader_first=True)
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
