"""Request-record ingest with miss reasons against the same ingest without them.

``demand.services.ingest_records`` (what ``POST /api/request-records/`` runs after validation)
on batches of served records (each names its engine and cached tokens), alternating
``PREWARM_MISS_REASONS`` off (the baseline, in the same run) and on, batch for batch, so both
see the same database growth and machine load. The residency index holds what a fleet would: 16
engines, 200 tenants' prefixes of 8-32 blocks resident on 1-3 engines (some only in part), and
recent removals on every engine. Records: 60% hits, the rest partial, cold, routed away,
evicted, variant; a tenant's records share its prefix, then a unique suffix.

Backend from the environment, as the control plane reads it: embedded (SQLite file, in-process
index) by default; ``DATABASE_URL`` + ``REDIS_URL`` for PostgreSQL and the Redis index.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from tempfile import TemporaryDirectory

from _common import parser, table, write_json

from wire.protocol import TIER_GPU

ENGINES = 16
TENANTS = 200
BS = 16


def setup_django(tmp: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("PREWARM_DATA_DIR", tmp)
    os.environ.setdefault("SQLITE_PATH", f"{tmp}/bench.sqlite3")
    os.environ.setdefault(
        "SECRET_KEY", "bench-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz"
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def world(rng: random.Random):
    """Engines, the index's residency and removals; returns (engine ids, prefixes, holders)."""
    from controlplane.core.residency_index import Delta
    from controlplane.demand.models import MissBucket, WorkloadKey
    from controlplane.fleet.configured_index import get_index
    from controlplane.fleet.models import Engine, Node

    MissBucket.objects.all().delete()
    WorkloadKey.objects.all().delete()
    index = get_index()
    index.clear()
    node, _ = Node.objects.get_or_create(name="bench-node")
    engines = [
        Engine.objects.get_or_create(node=node, engine_id=f"vllm-{i}", defaults={"block_size": BS})[
            0
        ].pk
        for i in range(ENGINES)
    ]
    prefixes, holders = [], []
    deltas = []
    for _ in range(TENANTS):
        chain = [rng.getrandbits(63) for _ in range(rng.randint(8, 32))]
        prefixes.append(chain)
        held = rng.sample(engines, rng.randint(1, 3))
        holders.append(held)
        for j, e in enumerate(held):
            depth = len(chain) if j == 0 else rng.randint(1, len(chain))
            stored = [
                (k, chain[i - 1] if i else None, TIER_GPU) for i, k in enumerate(chain[:depth])
            ]
            deltas.append(Delta(e, stored=stored))
    index.apply(deltas)
    # Recent removals on every engine: 2,000 blocks stored then removed each.
    for e in engines:
        gone = [rng.getrandbits(63) for _ in range(2000)]
        index.apply([Delta(e, stored=[(k, None, TIER_GPU) for k in gone])])
        index.apply([Delta(e, removed=[(k, TIER_GPU) for k in gone])])
    return engines, prefixes, holders


def batch(rng, engines, prefixes, holders, n: int) -> list[dict]:
    now = time.time()
    out = []
    for _ in range(n):
        t = rng.randrange(TENANTS)
        chain = prefixes[t] + [rng.getrandbits(63) for _ in range(rng.randint(1, 8))]
        roll = rng.random()
        if roll < 0.6:  # hit on the full holder
            engine, cached = holders[t][0], len(prefixes[t]) * BS
        elif roll < 0.7:
            engine, cached = holders[t][0], len(prefixes[t]) // 2 * BS
        else:  # a miss on another engine
            engine, cached = rng.choice(engines), 0
        out.append(
            {
                "time": now,
                "model": "m",
                "tenant": f"tenant-{t}",
                "keys": ["%016x" % k for k in chain],  # noqa: UP031
                "block_size": BS,
                "prompt_tokens": len(chain) * BS,
                "cached_tokens": cached,
                "predicted_cached_tokens": cached,
                "engine": str(engine),
            }
        )
    return out


def run(quick: bool) -> dict:
    from django.conf import settings

    from controlplane.demand.api.serializers import RequestBatchSerializer
    from controlplane.demand.services import ingest_records

    rng = random.Random(7)
    engines, prefixes, holders = world(rng)
    per_batch = 1000
    rounds = 6 if quick else 20
    times: dict[bool, list[float]] = {False: [], True: []}
    # Warm-up: every workload key created once (both modes then only update).
    for on in (False, True):
        settings.PREWARM_MISS_REASONS = on
        ingest_records(_valid(RequestBatchSerializer, batch(rng, engines, prefixes, holders, 2000)))
    for i in range(rounds):
        for on in (False, True) if i % 2 == 0 else (True, False):
            records = _valid(
                RequestBatchSerializer, batch(rng, engines, prefixes, holders, per_batch)
            )
            settings.PREWARM_MISS_REASONS = on
            t0 = time.perf_counter()
            ingest_records(records)
            times[on].append(time.perf_counter() - t0)
    settings.PREWARM_MISS_REASONS = True
    off, on = statistics.median(times[False]), statistics.median(times[True])
    return {
        "backend": settings.RESIDENCY_INDEX["backend"],
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        "records_per_batch": per_batch,
        "batches_each": rounds,
        "without_reasons_records_per_s": round(per_batch / off),
        "with_reasons_records_per_s": round(per_batch / on),
        "batch_ms_without": round(off * 1000, 1),
        "batch_ms_with": round(on * 1000, 1),
        "slowdown": round(on / off - 1, 4),
        "load_avg": os.getloadavg()[0],
    }


def _valid(serializer, records):
    s = serializer(data={"records": records})
    s.is_valid(raise_exception=True)
    return s.validated_data["records"]


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    with TemporaryDirectory() as tmp:
        setup_django(tmp)
        res = run(args.quick)
    print(
        table(
            [
                (
                    "without reasons (baseline)",
                    str(res["without_reasons_records_per_s"]),
                    str(res["batch_ms_without"]),
                ),
                ("with reasons", str(res["with_reasons_records_per_s"]), str(res["batch_ms_with"])),
            ],
            ("ingest", "records/s", "ms per 1,000-record batch (median)"),
        )
    )
    print(
        f"backend {res['database']} + {res['backend']} index; slowdown {res['slowdown']:+.1%} "
        f"(target within 10%); load {res['load_avg']:.2f}"
    )
    write_json(args.json, res)
    return 0 if res["slowdown"] <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
