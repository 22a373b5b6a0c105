"""Tokens: stored hashed, revocable, rotatable; enrolment tokens single-use and expiring."""

import hashlib

from django.core.management import call_command
from rest_framework.test import APIClient

from controlplane.accounts.models import ApiToken
from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Node
from tests.api.conftest import bearer, make_user
from tests.api.helpers import report


def test_agent_rotates_its_token_and_the_old_one_stops_working(enrol):
    node_id, agent = enrol("node-a")
    old_raw = agent._credentials["HTTP_AUTHORIZATION"].split()[1]
    resp = agent.post("/api/agents/rotate-token/")
    assert resp.status_code == 201
    new_raw = resp.json()["agent_token"]
    assert new_raw != old_raw and new_raw.startswith("pwa_")
    assert agent.post("/api/agents/report/", report(1), format="json").status_code == 401
    assert bearer(new_raw).post("/api/agents/report/", report(1), format="json").status_code == 200
    stored = ApiToken.objects.get(node_id=node_id, revoked_at__isnull=True)
    assert stored.digest == hashlib.sha256(new_raw.encode()).hexdigest()
    assert new_raw not in {t.digest for t in ApiToken.objects.all()}
    assert AuditEvent.objects.filter(action="node.token_rotated", object_id=str(node_id)).exists()


def test_admin_command_rotates_every_token_of_a_node(enrol, capsys):
    node_id, agent = enrol("node-a")
    call_command("rotate_agent_token", "node-a")
    new_raw = capsys.readouterr().out.strip()
    assert agent.post("/api/agents/heartbeat/", {}, format="json").status_code == 401
    assert bearer(new_raw).post("/api/agents/heartbeat/", {}, format="json").status_code == 200
    assert ApiToken.objects.filter(node_id=node_id, revoked_at__isnull=True).count() == 1


def test_rotated_token_belongs_to_the_same_node_only(enrol):
    _, agent_a = enrol("node-a")
    enrol("node-b")
    new_raw = agent_a.post("/api/agents/rotate-token/").json()["agent_token"]
    assert bearer(new_raw).post("/api/agents/report/", report(1), format="json").status_code == 200
    assert Node.objects.get(name="node-a").reports_applied == 1
    assert Node.objects.get(name="node-b").reports_applied == 0


def test_user_tokens_are_stored_hashed_and_revocable(db):
    admin = APIClient()
    admin.force_authenticate(make_user("admin"))
    resp = admin.post("/api/api-tokens/", {"kind": "user", "name": "ci"}, format="json")
    raw = resp.json()["token"]
    token = ApiToken.objects.get(name="ci")
    assert token.digest == hashlib.sha256(raw.encode()).hexdigest() and raw[:10] == token.prefix
    assert admin.get(f"/api/api-tokens/{token.pk}/").json().get("token") is None  # shown once only
    assert bearer(raw).get("/api/me/").status_code == 200
    assert admin.post(f"/api/api-tokens/{token.pk}/revoke/").status_code == 200
    assert bearer(raw).get("/api/me/").status_code == 401
