"""Every principal against every endpoint: people by role, tokens by kind."""

import json
import time

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken
from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Engine
from controlplane.replication.models import PlanItem, Policy, ReplicationPlan

from .conftest import bearer, make_user
from .helpers import report

PRINCIPALS = [
    "anonymous",
    "norole",
    "viewer",
    "operator",
    "admin",
    "user_token",
    "gateway",
    "agent",
]
PEOPLE_READ = {"viewer", "operator", "admin", "user_token"}  # the user token belongs to an operator
PEOPLE_OPERATE = {"operator", "admin", "user_token"}
ADMIN = {"admin"}

# (method, path template, body, principals allowed, the status every allowed principal gets)
MATRIX = [
    ("get", "/api/nodes/", None, PEOPLE_READ, 200),
    ("patch", "/api/nodes/{node}/", {"labels": {"zone": "b"}}, ADMIN, 200),
    ("get", "/api/gpus/", None, PEOPLE_READ, 200),
    ("get", "/api/engines/", None, PEOPLE_READ, 200),
    (
        "post",
        "/api/engines/{engine}/lifecycle/",
        {"lifecycle": "draining"},
        PEOPLE_OPERATE | {"agent"},
        200,
    ),
    ("get", "/api/workload-keys/", None, PEOPLE_READ, 200),
    ("get", "/api/history-imports/", None, PEOPLE_READ, 200),
    (
        "post",
        "/api/history-imports/",
        {
            "content": json.dumps(
                {"time": time.time() - 3600, "model": "m", "tenant": "t", "prompt_tokens": 9}
            ),
            "format": "jsonl",
        },
        PEOPLE_OPERATE,
        201,
    ),
    ("get", "/api/forecasts/", None, PEOPLE_READ, 200),
    ("get", "/api/plans/", None, PEOPLE_READ, 200),
    ("post", "/api/plans/{plan}/approve/", {}, PEOPLE_OPERATE, 200),
    ("post", "/api/plans/{plan}/reject/", {}, PEOPLE_OPERATE, 200),
    ("get", "/api/replication-jobs/", None, PEOPLE_READ, 200),
    ("get", "/api/speculative-replicas/", None, PEOPLE_READ, 200),
    ("get", "/api/policies/", None, PEOPLE_READ, 200),
    ("post", "/api/policies/", {"name": "p2", "mode": "manual"}, ADMIN, 201),
    ("patch", "/api/policies/{policy}/", {"min_confidence": 0.6}, ADMIN, 200),
    ("get", "/api/overrides/", None, PEOPLE_READ, 200),
    ("post", "/api/overrides/", {"kind": "freeze", "reason": "maintenance"}, PEOPLE_OPERATE, 201),
    ("get", "/api/audit-events/", None, PEOPLE_OPERATE, 200),
    ("post", "/api/residency/lookup/", {"keys": ["01"]}, PEOPLE_READ | {"gateway"}, 200),
    (
        "post",
        "/api/request-records/",
        {"records": [{"time": 1764540000, "model": "m", "tenant": "t", "keys": ["01"]}]},
        {"gateway"},
        200,
    ),
    ("post", "/api/agents/report/", None, {"agent"}, 200),
    ("post", "/api/agents/heartbeat/", {}, {"agent"}, 200),
    ("post", "/api/agents/rotate-token/", {}, {"agent"}, 201),
    ("get", "/api/api-tokens/", None, ADMIN, 200),
    ("post", "/api/api-tokens/", {"kind": "gateway", "name": "gw"}, ADMIN, 201),
    ("post", "/api/enrolment-tokens/", {"labels": {}}, ADMIN, 201),
    ("get", "/api/me/", None, PEOPLE_READ, 200),
    (
        "get",
        "/api/metrics/",
        None,
        PEOPLE_READ,
        200,
    ),  # Prometheus scrapes with a viewer's pwu_ token
]


@pytest.fixture
def world(enrol):
    node_id, agent = enrol("node-a")
    assert agent.post("/api/agents/report/", report(1), format="json").status_code == 200
    engine = Engine.objects.get()
    policy = Policy.objects.get(active=True)
    policy.mode = "manual"
    policy.save()
    plan = ReplicationPlan.objects.create(policy=policy, mode="manual")
    PlanItem.objects.create(
        plan=plan,
        prefix_keys=["01"],
        target=engine,
        bytes=1,
        expected_ttft_saved_s=1,
        cost_s=0.1,
        confidence=0.9,
        reason="test",
    )
    clients = {"anonymous": APIClient(), "agent": agent}
    for role in ("viewer", "operator", "admin"):
        clients[role] = APIClient()
        clients[role].force_authenticate(make_user(role))
    clients["norole"] = APIClient()
    clients["norole"].force_authenticate(make_user(None, "nobody"))
    owner = make_user("operator", "bot-owner")
    clients["user_token"] = bearer(ApiToken.issue(TokenKind.USER, "bot", user=owner)[1])
    clients["gateway"] = bearer(ApiToken.issue(TokenKind.GATEWAY, "gw")[1])
    return clients, {"node": node_id, "engine": engine.pk, "plan": plan.pk, "policy": policy.pk}


@pytest.mark.parametrize(
    "method, path, body, allowed, status", MATRIX, ids=[f"{m} {p}" for m, p, *_ in MATRIX]
)
@pytest.mark.parametrize("who", PRINCIPALS)
def test_role_matrix(world, who, method, path, body, allowed, status):
    clients, ids = world
    url = path.format(**ids)
    if path == "/api/agents/report/":
        body = report(2)
    resp = (
        getattr(clients[who], method)(url, body, format="json")
        if body is not None
        else getattr(clients[who], method)(url)
    )
    if who in allowed:
        assert resp.status_code == status, (who, url, resp.status_code, resp.content[:300])
    else:
        # Nobody signed in: 401 (authenticate); a known principal without the right: 403.
        refused = 401 if who == "anonymous" else 403
        assert resp.status_code == refused, (who, url, resp.status_code, resp.content[:300])


def test_refused_write_changes_nothing_and_allowed_write_is_audited(world):
    clients, ids = world
    before = AuditEvent.objects.count()
    resp = clients["operator"].patch(
        f"/api/policies/{ids['policy']}/", {"max_spec_vram_fraction": 0.4}, format="json"
    )
    assert resp.status_code == 403
    assert Policy.objects.get(pk=ids["policy"]).max_spec_vram_fraction == 0.05
    assert AuditEvent.objects.count() == before
    resp = clients["admin"].patch(
        f"/api/policies/{ids['policy']}/", {"max_spec_vram_fraction": 0.1}, format="json"
    )
    assert resp.status_code == 200
    event = AuditEvent.objects.filter(action="policy.updated").get()
    assert event.actor_label == "user:u-admin"
    assert (
        event.before["max_spec_vram_fraction"] == 0.05
        and event.after["max_spec_vram_fraction"] == 0.1
    )


def test_revoked_and_expired_tokens_are_refused(world):
    token, raw = ApiToken.issue(TokenKind.GATEWAY, "old")
    client = bearer(raw)
    rec = {"records": [{"time": 1764540000, "model": "m", "tenant": "t", "keys": ["01"]}]}
    assert client.post("/api/request-records/", rec, format="json").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")
    assert client.post("/api/request-records/", rec, format="json").status_code == 401
    token2, raw2 = ApiToken.issue(TokenKind.GATEWAY, "exp", expires_at="2001-01-01T00:00:00Z")
    assert bearer(raw2).post("/api/request-records/", rec, format="json").status_code == 401
