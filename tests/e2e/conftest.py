"""End-to-end fixtures: a whole cluster of processes on the real PostgreSQL and its own Redis."""

from __future__ import annotations

import shutil

import pytest

from harness.e2e.cluster import Cluster
from harness.e2e.settings import PG_URL
from harness.processes import pg_admin


def _postgres_reachable() -> bool:
    try:
        pg_admin(PG_URL, "SELECT 1")
        return True
    except Exception:
        return False


@pytest.fixture
def services_cluster(tmp_path, request):
    if not shutil.which("redis-server") or not _postgres_reachable():
        pytest.skip("needs PostgreSQL and redis-server (make test-services)")
    cluster = Cluster(tmp_path / "cluster", nodes=getattr(request, "param", 3))
    try:
        cluster.start()
        yield cluster
    finally:
        print(cluster.logs()[-12000:])
        cluster.close()
