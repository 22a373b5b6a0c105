"""Residency ingest through the real agent report endpoint (daphne), in-process and Redis index.

Reports are built with the agent's own encoder (``wire.protocol`` rows,
``nodeagent.reporter.encode_report``): msgpack with integer keys, stored rows chained to their
parents, as ``nodeagent`` sends them.

Three phases per index backend:
- throughput: concurrent simulated agents post reports of 5,000 residency deltas back to back;
  deltas/s of the one web process;
- service time: one agent posts 200-delta reports back to back, one at a time; ms per report,
  with nothing queued (64 agents at 1 Hz fit in one process only if this is well under 15.6 ms);
- latency: 64 agents report once a second with realistic churn (200 deltas each); p50/p99.
Baseline in the same run: the same deltas applied straight to the index (no HTTP, no database),
the ceiling for the endpoint.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import msgpack
from _common import parser, percentile, table, write_json

from nodeagent.reporter import encode_report
from wire import protocol

PG_URL = os.environ.get("PREWARM_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/prewarm_bench")
REDIS_URL = os.environ.get("PREWARM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
SECRET = "bench-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz"


def body(
    seq: int,
    boot: str,
    n_deltas: int,
    rng: random.Random,
    mode: str = protocol.MODE_DELTA,
    encoding: str = protocol.ENCODING_MSGPACK,
) -> bytes:
    """One report as the agent builds it: 3/4 stored (chains of 8 blocks), 1/4 removed."""
    stored: list[tuple[int, int | None, str, int]] = []
    parent = None
    for i in range(n_deltas * 3 // 4):
        key = rng.getrandbits(64)
        stored.append((key, parent, protocol.TIER_GPU, 0))
        parent = None if i % 8 == 7 else key
    removed = [(rng.getrandbits(64), protocol.TIER_GPU) for _ in range(n_deltas - len(stored))]
    hex_keys = encoding == protocol.ENCODING_JSON
    return encode_report(
        {
            "seq": seq,
            "boot_id": boot,
            "sent_at": time.time(),
            "gpus": [
                {
                    "uuid": f"GPU-{boot}",
                    "index": 0,
                    "memory_total": 80 << 30,
                    "memory_used": 60 << 30,
                    "memory_free": 20 << 30,
                }
            ],
            "engines": [
                {
                    "engine_id": "e0",
                    "block_size": 16,
                    "bytes_per_block": 5 << 20,
                    "kv_capacity_blocks": 10000,
                    "gpu_uuids": [f"GPU-{boot}"],
                }
            ],
            "residency": [
                protocol.residency_entry(
                    "e0",
                    mode,
                    protocol.encode_stored(stored, hex_keys),
                    protocol.encode_removed(removed, hex_keys),
                    False,
                )
            ],
        },
        encoding,
    )


class Agent:
    def __init__(self, token: str, rng: random.Random):
        self.token, self.rng, self.seq, self.boot = token, rng, 0, uuid.uuid4().hex

    def next_body(self, n: int) -> bytes:
        self.seq += 1
        return body(
            self.seq,
            self.boot,
            n,
            self.rng,
            protocol.MODE_SNAPSHOT if self.seq == 1 else protocol.MODE_DELTA,
        )


async def post(client: httpx.AsyncClient, agent: Agent, payload: bytes) -> float:
    t0 = time.perf_counter()
    resp = await client.post(
        "/api/agents/report/",
        content=payload,
        headers={
            "Authorization": f"Bearer {agent.token}",
            "Content-Type": protocol.CONTENT_MSGPACK,
        },
    )
    if resp.status_code != 200:
        raise RuntimeError(f"report refused: {resp.status_code} {resp.text[:200]}")
    return time.perf_counter() - t0


async def throughput(url: str, agents: list[Agent], seconds: float, n: int) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for a in agents:  # the first report of each agent is its snapshot
            await post(client, a, a.next_body(10))
        done = 0
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()

        async def worker(a: Agent):
            nonlocal done
            while time.perf_counter() < deadline:
                await post(client, a, a.next_body(n))
                done += n

        await asyncio.gather(*(worker(a) for a in agents))
        return done / (time.perf_counter() - start)


async def service_time(url: str, agent: Agent, reports: int, n: int) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await post(client, agent, agent.next_body(10))
        return [await post(client, agent, agent.next_body(n)) for _ in range(reports)]


async def latency(url: str, agents: list[Agent], seconds: float, n: int) -> list[float]:
    lat: list[float] = []
    async with httpx.AsyncClient(
        base_url=url, timeout=30, limits=httpx.Limits(max_connections=len(agents))
    ) as client:
        for a in agents:
            await post(client, a, a.next_body(10))

        async def agent_loop(a: Agent, offset: float):
            await asyncio.sleep(offset)
            nxt = time.perf_counter()
            end = nxt + seconds
            while nxt < end:
                lat.append(await post(client, a, a.next_body(n)))
                nxt += 1.0
                await asyncio.sleep(max(0.0, nxt - time.perf_counter()))

        await asyncio.gather(*(agent_loop(a, i / len(agents)) for i, a in enumerate(agents)))
    return lat


def baseline(n_reports: int, n: int) -> float:
    from controlplane.core.agent_report import parse_report
    from controlplane.core.residency_index import Delta, InProcessResidencyIndex

    idx, rng = InProcessResidencyIndex(), random.Random(1)
    bodies = [body(i + 2, "b", n, rng) for i in range(n_reports)]
    t0 = time.perf_counter()
    for raw in bodies:
        rep = parse_report(msgpack.unpackb(raw, strict_map_key=False))
        idx.apply([Delta(1, stored=r.stored, removed=r.removed) for r in rep.residency])
    return n * n_reports / (time.perf_counter() - t0)


def components(n_reports: int, n: int) -> dict:
    """Deltas/s of each step of a report, no HTTP/DB: decode + parse of the agent's wire (integer
    keys) and of the older agents' wire (hex keys in msgpack), and the Redis index's apply."""
    import json

    from controlplane.core.agent_report import parse_report
    from controlplane.core.residency_index import Delta

    rng = random.Random(2)
    ints = [body(i + 2, "b", n, rng) for i in range(n_reports)]
    hexes = [
        msgpack.packb(json.loads(body(i + 2, "b", n, rng, encoding=protocol.ENCODING_JSON)))
        for i in range(n_reports)
    ]
    out = {}
    t0 = time.perf_counter()
    for b in ints:
        msgpack.unpackb(b, strict_map_key=False)
    out["baseline_plain_msgpack_decode"] = round(n * n_reports / (time.perf_counter() - t0))
    for name, bodies in (("decode_parse_int_keys", ints), ("decode_parse_hex_keys", hexes)):
        t0 = time.perf_counter()
        reports = [parse_report(msgpack.unpackb(b, strict_map_key=False)) for b in bodies]
        out[name] = round(n * n_reports / (time.perf_counter() - t0))
    try:
        import redis

        from controlplane.core.residency_redis import RedisResidencyIndex

        index = RedisResidencyIndex(redis.Redis.from_url(REDIS_URL), namespace="bench-direct")
        index.clear()
        t0 = time.perf_counter()
        for i, rep in enumerate(reports):
            index.apply(
                [Delta(1 + i % 4, stored=r.stored, removed=r.removed) for r in rep.residency]
            )
        out["redis_apply"] = round(n * n_reports / (time.perf_counter() - t0))
        index.clear()
        # The floor for a Redis index: the same number of fields written by a bare pipeline
        # (one HSET of every delta's key per report, no script, no reads), same connection.
        client = redis.Redis.from_url(REDIS_URL)
        t0 = time.perf_counter()
        for i, rep in enumerate(reports):
            pipe = client.pipeline(transaction=False)
            fields = {}
            for r in rep.residency:
                fields.update(("%016x" % k, 1) for k, _p, _m in r.stored)  # noqa: UP031
                fields.update(("%016x" % k, 0) for k, _m in r.removed)  # noqa: UP031
            pipe.hset(f"{{bench-bare}}:{i % 4}", mapping=fields)
            pipe.execute()
        out["baseline_bare_redis_pipeline"] = round(n * n_reports / (time.perf_counter() - t0))
        client.delete(*[f"{{bench-bare}}:{i}" for i in range(4)])
    except Exception as exc:  # no Redis here: the other figures stand
        out["redis_apply"] = f"unavailable: {exc}"
    return out


def run_backend(name: str, env: dict[str, str], quick: bool, profile: Path | None = None) -> dict:
    import sys

    from harness.live import LiveControlPlane

    daphne = None
    if profile:  # daphne under cProfile: <profile>/<backend>.loop.prof and .views.prof
        profile.mkdir(parents=True, exist_ok=True)
        daphne = [
            sys.executable,
            str(Path(__file__).parent / "_profile_daphne.py"),
            str(profile / name),
        ]
    with TemporaryDirectory() as tmp:
        cp = LiveControlPlane(Path(tmp), env={**env, "LOG_LEVEL": "WARNING"}, daphne=daphne)
        cp.manage("migrate", "-v0")
        if name == "redis":
            import redis

            redis.Redis.from_url(REDIS_URL).flushdb()
        # One process for the 64 tokens: 64 manage.py starts took minutes on a busy machine.
        out = cp.manage(
            "shell",
            "-c",
            "from controlplane.accounts.models import EnrolmentToken\n"
            "for _ in range(64): print('TOKEN', EnrolmentToken.issue()[1])",
        )
        tokens = [line.split()[1] for line in out.splitlines() if line.startswith("TOKEN ")]
        cp.start()
        try:
            agent_tokens = []
            for i, tok in enumerate(tokens):
                resp = httpx.post(
                    f"{cp.url}/api/agents/enrol/",
                    json={"enrolment_token": tok, "hostname": f"bench-{i}"},
                )
                agent_tokens.append(resp.json()["agent_token"])
            rng = random.Random(7)
            agents = [Agent(t, random.Random(rng.random())) for t in agent_tokens]
            load0 = os.getloadavg()[0]
            tput = asyncio.run(throughput(cp.url, agents[:4], 4 if quick else 15, 5000))
            serial = asyncio.run(service_time(cp.url, agents[4], 30 if quick else 300, 200))
            lat = asyncio.run(latency(cp.url, agents, 5 if quick else 20, 200))
        finally:
            cp.close()
    return {
        "deltas_per_s": round(tput),
        "service_ms_p50": round(percentile(serial, 50) * 1000, 1),
        "service_ms_mean": round(sum(serial) / len(serial) * 1000, 1),
        "report_p50_ms": round(percentile(lat, 50) * 1000, 1),
        "report_p99_ms": round(percentile(lat, 99) * 1000, 1),
        "latency_reports": len(lat),
        "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


class _NotRun(Exception):
    pass


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--profile", type=Path, help="run daphne under cProfile; profiles go to this folder"
    )
    p.add_argument("--backends", default="inprocess,redis", help="which of inprocess,redis to run")
    args = p.parse_args()
    backends = args.backends.split(",")
    base_env = {"DATABASE_URL": "", "REDIS_URL": ""}
    load0 = round(os.getloadavg()[0], 2)
    results = {"load_avg_1m_start": load0}
    results["inprocess"] = (
        run_backend("inprocess", base_env, args.quick, args.profile)
        if "inprocess" in backends
        else {"error": "not run (--backends)"}
    )
    try:
        if "redis" not in backends:
            raise _NotRun

        import redis

        from harness.processes import ensure_database

        redis.Redis.from_url(REDIS_URL).ping()
        ensure_database(PG_URL)
        env = {
            "DATABASE_URL": PG_URL,
            "REDIS_URL": REDIS_URL,
            "SECRET_KEY": SECRET,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PREWARM_SECURE": "false",
        }
        results["redis"] = run_backend("redis", env, args.quick, args.profile)
    except _NotRun:
        results["redis"] = {"error": "not run (--backends)"}
    except Exception as exc:  # services missing: say so, keep the in-process figures
        results["redis"] = {"error": f"PostgreSQL/Redis not available: {exc}"}
    results["baseline_direct_apply_deltas_per_s"] = round(baseline(20 if args.quick else 100, 5000))
    results["components_deltas_per_s"] = components(20 if args.quick else 100, 5000)
    results["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    rows = []
    for name in ("inprocess", "redis"):
        r = results[name]
        rows.append(
            (
                name,
                f"{r.get('deltas_per_s', 0):,}",
                str(r.get("service_ms_p50", "-")),
                str(r.get("report_p50_ms", "-")),
                str(r.get("report_p99_ms", "-")),
            )
        )
    rows.append(
        (
            "baseline: parse+apply, no HTTP/DB",
            f"{results['baseline_direct_apply_deltas_per_s']:,}",
            "-",
            "-",
            "-",
        )
    )
    for name, value in results["components_deltas_per_s"].items():
        rows.append(
            (f"component: {name}", f"{value:,}" if isinstance(value, int) else value, "-", "-", "-")
        )
    print(
        table(
            rows,
            (
                "index",
                "deltas/s (1 web process)",
                "ms/report alone (p50)",
                "p50 ms (64 agents @1Hz)",
                "p99 ms",
            ),
        )
    )
    print(
        f"load average (1 min): {results['load_avg_1m_start']} at the start, "
        f"{results['load_avg_1m_end']} at the end"
    )
    comp = results["components_deltas_per_s"]
    ratios = {}
    plain = comp.get("baseline_plain_msgpack_decode")
    bare = comp.get("baseline_bare_redis_pipeline")
    for name, target, base, base_name in (
        ("inprocess", 200_000, plain, "plain msgpack decode"),
        ("redis", 150_000, bare, "bare Redis pipeline"),
    ):
        got = results[name].get("deltas_per_s")
        if got and isinstance(base, int):
            ratios[name] = {
                "of_target": round(got / target, 2),
                "of_baseline": round(got / base, 3),
            }
            print(
                f"{name}: {got:,} deltas/s = {got / target:.2f} of the {target:,} target, "
                f"{got / base:.3f} of the {base_name} ({base:,}/s) in the same run"
            )
    for name, limit in (("inprocess", 100.0), ("redis", 250.0)):
        p99 = results[name].get("report_p99_ms")
        if p99 is not None:
            ratios.setdefault(name, {})["p99_of_limit"] = round(p99 / limit, 2)
            print(
                f"{name}: 64 agents @1 Hz p99 {p99} ms = {p99 / limit:.2f} of the {limit:.0f} ms limit"
            )
    results["ratios"] = ratios
    print(
        "targets: >= 200,000 deltas/s in process, >= 150,000 on Redis per web process; "
        "64 agents at 1 Hz p99 < 100 ms in process, < 250 ms on Redis"
    )
    write_json(args.json, results)


if __name__ == "__main__":
    main()
