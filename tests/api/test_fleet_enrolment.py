"""A fleet enrolment token: one secret a DaemonSet or a fleet of sidecars shares, good for
``max_uses`` agents until it expires, stored hashed, registered from a deployment's Secret."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from controlplane.accounts.models import EnrolmentToken, digest
from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Node

FLEET_RAW = "pwe_" + "f" * 43


def enrol(raw, hostname):
    return APIClient().post(
        "/api/agents/enrol/", {"enrolment_token": raw, "hostname": hostname}, format="json"
    )


def test_a_fleet_token_enrols_max_uses_agents_then_refuses(db):
    _, raw = EnrolmentToken.issue(max_uses=3)
    for i in range(3):
        assert enrol(raw, f"gpu-{i}").status_code == 201
    refused = enrol(raw, "gpu-3")
    assert refused.status_code == 403 and refused.json()["field"] == "enrolment_token"
    assert sorted(Node.objects.values_list("name", flat=True)) == ["gpu-0", "gpu-1", "gpu-2"]
    token = EnrolmentToken.objects.get()
    assert token.uses == 3 and token.node.name == "gpu-2"


def test_an_admin_issues_a_fleet_token_through_the_api(client_for):
    resp = client_for("admin").post(
        "/api/enrolment-tokens/", {"max_uses": 2, "ttl_seconds": 3600}, format="json"
    )
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["max_uses"] == 2 and body["uses"] == 0
    assert enrol(body["token"], "a").status_code == 201
    assert enrol(body["token"], "b").status_code == 201
    assert enrol(body["token"], "c").status_code == 403


def register(monkeypatch, raw=FLEET_RAW, *args):
    monkeypatch.setenv("PREWARM_FLEET_ENROLMENT_TOKEN", raw)
    out = StringIO()
    call_command("ensure_fleet_enrolment_token", *args, stdout=out)
    return out.getvalue()


def test_the_charts_token_is_registered_hashed_and_renewed_on_upgrade(db, monkeypatch):
    said = register(monkeypatch, FLEET_RAW, "--max-uses", "2", "--ttl", "3600")
    assert "registered" in said and FLEET_RAW not in said
    token = EnrolmentToken.objects.get()
    assert token.digest == digest(FLEET_RAW) and token.max_uses == 2
    assert enrol(FLEET_RAW, "gpu-0").status_code == 201
    first_expiry = token.expires_at
    # An upgrade runs it again with a larger bound: uses so far still count, the expiry moves on.
    said = register(monkeypatch, FLEET_RAW, "--max-uses", "3", "--ttl", "7200")
    assert "renewed: 1 of 3" in said
    token.refresh_from_db()
    assert token.uses == 1 and token.max_uses == 3 and token.expires_at > first_expiry
    assert EnrolmentToken.objects.count() == 1
    assert enrol(FLEET_RAW, "gpu-1").status_code == 201
    assert enrol(FLEET_RAW, "gpu-2").status_code == 201
    assert enrol(FLEET_RAW, "gpu-3").status_code == 403
    actions = list(AuditEvent.objects.values_list("action", flat=True).order_by("id"))
    assert actions.count("enrolment_token.created") == 1
    assert actions.count("enrolment_token.updated") == 1


@pytest.mark.parametrize(
    "raw,args,msg",
    [
        ("", ["--max-uses", "2", "--ttl", "3600"], "is required but not set"),
        ("pwe_short", ["--max-uses", "2", "--ttl", "3600"], r"40\+ characters"),
        ("x" * 50, ["--max-uses", "2", "--ttl", "3600"], "pwe_"),
        (FLEET_RAW, ["--max-uses", "0", "--ttl", "3600"], "at least 1"),
    ],
)
def test_a_bad_fleet_token_is_refused_with_one_line(db, monkeypatch, raw, args, msg):
    with pytest.raises(CommandError, match=msg):
        register(monkeypatch, raw, *args)
    assert not EnrolmentToken.objects.exists()
