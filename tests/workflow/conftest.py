"""Workflow fixtures: tasks run inline (eager) on commit, a small fleet reporting over the API."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken, EnrolmentToken
from controlplane.replication.models import Policy
from harness import burst
from tests.api.conftest import make_user
from wire import blockhash

BYTES_PER_BLOCK = 64 * 1024


@pytest.fixture
def eager(settings):
    """Run Celery tasks inline where they are sent (on commit, as in production)."""
    from controlplane.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield app
    app.conf.task_always_eager = False


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def engine_report(
    seq: int,
    name: str,
    keys=(),
    transfer="127.0.0.1:7701",
    kv_blocks=100_000,
    metrics: dict | None = None,
):
    stored = [
        [blockhash.to_hex(k), blockhash.to_hex(keys[i - 1]) if i else None, "GPU", 0]
        for i, k in enumerate(keys)
    ]
    return {
        "seq": seq,
        "boot_id": f"boot-{name}",
        "sent_at": 1764540000.0 + seq,
        "gpus": [],
        "engines": [
            {
                "engine_id": "vllm-0",
                "kind": "vllm",
                "model": burst.MODEL,
                "block_size": 16,
                "bytes_per_block": BYTES_PER_BLOCK,
                "kv_capacity_blocks": kv_blocks,
                "gpu_uuids": [],
                "endpoints": {"transfer": transfer},
                # The holder is busy (one running request fills its one slot), the others are
                # idle and have room: where a replica pays.
                "metrics": {
                    "kv_usage": 0.85 if keys else 0.3,
                    "running": 1 if keys else 0,
                    **(metrics or {}),
                },
            }
        ],
        "residency": [
            {
                "engine_id": "vllm-0",
                "mode": "snapshot",
                "stored": stored,
                "removed": [],
                "cleared": False,
            }
        ],
    }


class Fleet:
    """Three enrolled nodes with one engine each; node-a holds the burst's prefix."""

    def __init__(self):
        for role in (
            "viewer",
            "operator",
            "admin",
        ):  # a transactional test flushes the migrations' rows
            Group.objects.get_or_create(name=role)
        self.agents, self.nodes, self.tokens = {}, {}, {}
        for i, name in enumerate(("node-a", "node-b", "node-c")):
            self.enrol(name, burst.PREFIX if name == "node-a" else (), f"127.0.0.1:{7701 + i}")
        _, graw = ApiToken.issue(TokenKind.GATEWAY, "gw")
        self.gateway = bearer(graw)
        self.operator = APIClient()
        self.operator.force_authenticate(make_user("operator", "op"))
        self.admin = APIClient()
        self.admin.force_authenticate(make_user("admin", "adm"))

    def enrol(self, name: str, keys=(), transfer="127.0.0.1:7799") -> int:
        """Enrol a node with one engine holding ``keys``, as its agent would; returns its id."""
        _, raw = EnrolmentToken.issue()
        resp = APIClient().post(
            "/api/agents/enrol/", {"enrolment_token": raw, "hostname": name}, format="json"
        )
        assert resp.status_code == 201, resp.content
        self.nodes[name] = resp.json()["node_id"]
        self.tokens[name] = resp.json()["agent_token"]
        self.agents[name] = bearer(self.tokens[name])
        r = self.agents[name].post(
            "/api/agents/report/", engine_report(1, name, keys, transfer), format="json"
        )
        assert r.status_code == 200, r.content
        return self.nodes[name]

    def report(self, name: str, keys=(), seq: int = 2, metrics: dict | None = None):
        """``name``'s agent reports its engine holding ``keys`` (a snapshot of its KV events)
        and its vLLM ``metrics`` (added to the default load)."""
        r = self.agents[name].post(
            "/api/agents/report/",
            engine_report(seq, name, keys, metrics=metrics),
            format="json",
        )
        assert r.status_code == 200, r.content
        return r.json()

    def post_burst(self, end: float):
        # The burst ends in the bucket before ``end``'s; a forecast that runs after the next
        # bucket boundary would see an empty last bucket, so never start within 10 s of one.
        if end % 60 > 50 and abs(end - time.time()) < 1:
            time.sleep(61 - end % 60)
            end = time.time()
        resp = self.gateway.post(
            "/api/request-records/", {"records": burst.records(end)}, format="json"
        )
        assert resp.status_code == 200, resp.content
        return resp.json()

    def policy(self, mode: str, **kw) -> Policy:
        data = {
            "name": f"p-{mode}",
            "active": True,
            "mode": mode,
            "min_confidence": 0.0,
            "horizon_seconds": 300,
            **kw,
        }
        resp = self.admin.post("/api/policies/", data, format="json")
        assert resp.status_code == 201, resp.content
        return Policy.objects.get(pk=resp.json()["id"])


@pytest.fixture
def fleet(transactional_db, eager, settings):
    # The cycle's tests see the cycle's plans alone; tests of planning at ingest turn it on.
    settings.PREWARM_REACT_AT_INGEST = False
    return Fleet()
