"""Two web processes ingesting request records at once: the new workload keys they both create
are taken in one order, so PostgreSQL never finds a deadlock between them (bench/load.py with
two web processes hit "deadlock detected ... workload_key_unique" -> 500 before)."""

import threading

import pytest
from django.db import connection
from django.db.models import Sum

from controlplane.demand import services
from controlplane.demand.models import DemandBucket, WorkloadKey
from wire import blockhash

# PostgreSQL's row and index locks are what is tested (the test run's SQLite is one in-memory
# database with table locks, where the embedded writer lock serialises writers anyway).
pytestmark = pytest.mark.services


def record(key_hex: str) -> dict:
    return {
        "time": 1764540000.0,
        "model": "m",
        "tenant": "t",
        "keys": [key_hex],
        "block_size": 512,
        "prompt_tokens": 512,
    }


def test_crossed_batches_creating_the_same_new_keys_both_land(transactional_db, monkeypatch):
    a, b = blockhash.to_hex(11), blockhash.to_hex(22)
    batches = [[record(a), record(b)], [record(b), record(a)]]  # the same new keys, crossed
    # Each batch pauses after its first key until the other has one too (or, where the other is
    # waiting on the database for that very key, until the bound runs out): without one order,
    # each would then ask for the key the other holds.
    both_have_one = threading.Barrier(2)
    manager = WorkloadKey.objects
    real = manager.get_or_create
    seen = threading.local()

    def get_or_create(**kw):
        out = real(**kw)
        if not getattr(seen, "first", False):
            seen.first = True
            try:
                both_have_one.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass
        return out

    monkeypatch.setattr(manager, "get_or_create", get_or_create)
    errors: list[BaseException] = []

    def ingest(batch):
        try:
            services.ingest_records(batch)
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever broke
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ingest, args=(batch,)) for batch in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert WorkloadKey.objects.filter(tenant="t", model="m").count() == 2
    assert DemandBucket.objects.aggregate(n=Sum("requests"))["n"] == 4
