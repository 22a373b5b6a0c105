"""The app contract: each audited write is one service function that the API, the admin and the
management commands all go through (so each path leaves the same audit record and obeys the same
rule); filtersets shared by the API and the pages; domain errors mapped by the one handler."""

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken
from controlplane.audit.models import AuditEvent
from controlplane.core.errors import Conflict, DomainError
from controlplane.fleet.models import Engine, Node
from controlplane.replication.models import Override, Policy, ReplicationJob, ReplicationPlan

from .conftest import make_user


@pytest.fixture
def boss(db):
    """A Django admin (the /admin/ site) signed in."""
    client = Client()
    client.force_login(User.objects.create_superuser("boss", password="pw-123456789"))
    return client


@pytest.fixture
def engine(db):
    node = Node.objects.create(name="node-a")
    return Engine.objects.create(node=node, engine_id="e0", lifecycle="serving")


def events(action):
    return list(AuditEvent.objects.filter(action=action).order_by("id"))


def policy_form(name, **over):
    """The admin's add/change form: the model's field names (durations ``_s``)."""
    fields = {
        "name": name,
        "mode": "manual",
        "strategy": "predictive",
        "max_spec_vram_fraction": "0.05",
        "max_bytes_per_interval": "1000",
        "interval_s": "60",
        "min_confidence": "0.5",
        "replica_ttl_s": "900",
        "horizon_s": "600",
        "forecast_every_s": "300",
        "plan_every_s": "30",
        "default_transport": "tcp",
        "min_benefit_ratio": "2.0",
        "max_queue_s": "2.0",
        "max_cluster_queue_s": "",
        "active": "on",
    }
    return {**fields, **over}


def only_active():
    return list(Policy.objects.filter(active=True).values_list("name", flat=True))


# -- one active policy: replication.services.save_policy --------------------------------------


def test_activating_a_policy_through_the_api_deactivates_the_other_audited(client_for):
    first = Policy.objects.get(active=True)  # the migration installs one
    api = client_for("admin")
    resp = api.post("/api/policies/", {"name": "second", "active": True}, format="json")
    assert resp.status_code == 201, resp.content
    assert only_active() == ["second"]
    [off] = events("policy.deactivated")
    assert off.object_id == str(first.pk) and off.before["active"] and not off.after["active"]
    assert off.actor_label == "user:u-admin"
    assert [e.object_id for e in events("policy.created")] == [str(resp.json()["id"])]


def test_activating_a_policy_in_the_admin_deactivates_the_other_audited(boss):
    first = Policy.objects.get(active=True)
    resp = boss.post("/admin/replication/policy/add/", policy_form("from-admin"))
    assert resp.status_code == 302, resp.content.decode()[-2000:]
    assert only_active() == ["from-admin"]
    [off] = events("policy.deactivated")
    assert off.object_id == str(first.pk) and off.actor_label == "user:boss"
    [created] = events("policy.created")
    assert created.after["name"] == "from-admin" and created.actor_label == "user:boss"
    # Changing it in the admin is audited too, before and after.
    resp = boss.post(
        f"/admin/replication/policy/{created.object_id}/change/",
        policy_form("from-admin", min_confidence="0.7"),
    )
    assert resp.status_code == 302
    [updated] = events("policy.updated")
    assert updated.before["min_confidence"] == 0.5 and updated.after["min_confidence"] == 0.7


def test_ensure_policy_deactivates_the_other_audited(db):
    first = Policy.objects.get(active=True)
    call_command("ensure_policy", "cli", "--fields", '{"mode": "auto"}', stdout=StringIO())
    assert only_active() == ["cli"]
    [off] = events("policy.deactivated")
    assert off.object_id == str(first.pk) and off.actor_label == "system"
    [created] = events("policy.created")
    assert created.after["mode"] == "auto" and created.reason == "manage.py ensure_policy"
    call_command("ensure_policy", "cli", "--fields", '{"mode": "manual"}', stdout=StringIO())
    [updated] = events("policy.updated")
    assert updated.before["mode"] == "auto" and updated.after["mode"] == "manual"


def test_a_policy_with_plans_is_not_deleted_by_the_api_or_the_admin(client_for, boss):
    policy = Policy.objects.get(active=True)
    ReplicationPlan.objects.create(policy=policy, mode="manual")
    resp = client_for("admin").delete(f"/api/policies/{policy.pk}/")
    assert resp.status_code == 409
    assert resp.json() == {
        "error": "in_use",
        "detail": "this policy has plans; deactivate it instead",
        "field": None,
    }
    # The admin refuses it (its plans protect it) and records nothing.
    resp = boss.post(f"/admin/replication/policy/{policy.pk}/delete/", {"post": "yes"})
    assert "Cannot delete policy" in resp.content.decode()
    assert Policy.objects.filter(pk=policy.pk).exists() and not events("policy.deleted")
    unused = Policy.objects.create(name="unused")
    assert (
        boss.post(f"/admin/replication/policy/{unused.pk}/delete/", {"post": "yes"}).status_code
        == 302
    )
    [deleted] = events("policy.deleted")
    assert deleted.object_id == str(unused.pk) and deleted.actor_label == "user:boss"


# -- engine lifecycle: fleet.services.change_engine_lifecycle ---------------------------------


def test_engine_lifecycle_through_the_api_is_checked_and_audited(client_for, engine):
    api = client_for("operator")
    resp = api.post(
        f"/api/engines/{engine.pk}/lifecycle/",
        {"lifecycle": "draining", "reason": "maintenance"},
        format="json",
    )
    assert resp.status_code == 200 and resp.json()["lifecycle"] == "draining"
    [event] = events("engine.lifecycle")
    assert (event.before["lifecycle"], event.after["lifecycle"]) == ("serving", "draining")
    assert event.reason == "maintenance" and event.actor_label == "user:u-operator"
    Engine.objects.filter(pk=engine.pk).update(lifecycle="serving")
    resp = api.post(f"/api/engines/{engine.pk}/lifecycle/", {"lifecycle": "warming"}, format="json")
    assert resp.status_code == 409
    assert resp.json() == {
        "error": "illegal_lifecycle",
        "detail": "serving -> warming is not allowed",
        "field": "lifecycle",
    }


def test_engine_lifecycle_in_the_admin_is_checked_and_audited(boss, engine):
    url = f"/admin/fleet/engine/{engine.pk}/change/"
    resp = boss.post(url, {"lifecycle": "warming"}, follow=True)
    assert "erving -&gt; warming is not allowed" in resp.content.decode()  # shown capitalised
    engine.refresh_from_db()
    assert engine.lifecycle == "serving" and not events("engine.lifecycle")
    assert boss.post(url, {"lifecycle": "draining"}).status_code == 302
    engine.refresh_from_db()
    [event] = events("engine.lifecycle")
    assert engine.lifecycle == "draining" and event.actor_label == "user:boss"
    assert event.after["lifecycle"] == "draining"


def test_engine_lifecycle_command_is_checked_and_audited(engine):
    with pytest.raises(CommandError, match="serving -> warming is not allowed"):
        call_command("engine_lifecycle", "node-a/e0", "warming", stdout=StringIO())
    assert not events("engine.lifecycle")
    call_command(
        "engine_lifecycle", "node-a/e0", "draining", "--reason", "reboot", stdout=StringIO()
    )
    [event] = events("engine.lifecycle")
    assert event.after["lifecycle"] == "draining" and event.reason == "reboot"
    assert event.actor_label == "system"


# -- node changes: fleet.services.update_node ----------------------------------------------------


def test_node_changes_through_the_api_and_the_admin_are_audited(client_for, boss, engine):
    node = engine.node
    resp = client_for("admin").patch(
        f"/api/nodes/{node.pk}/", {"labels": {"zone": "b"}}, format="json"
    )
    assert resp.status_code == 200
    Node.objects.filter(pk=node.pk).update(last_seq=41)  # its agent reports meanwhile
    resp = boss.post(
        f"/admin/fleet/node/{node.pk}/change/", {"labels": '{"zone": "b"}', "state": "retired"}
    )
    assert resp.status_code == 302, resp.content.decode()[-2000:]
    node.refresh_from_db()
    assert node.state == "retired" and node.last_seq == 41  # only the changed field written
    api_event, admin_event = events("node.updated")
    assert api_event.after["labels"] == {"zone": "b"} and api_event.actor_label == "user:u-admin"
    assert (admin_event.before["state"], admin_event.after["state"]) == ("active", "retired")
    assert admin_event.actor_label == "user:boss"


# -- overrides: replication.services.save_override / delete_override --------------------------


def test_overrides_through_the_api_and_the_admin_are_audited(client_for, boss, engine):
    resp = client_for("operator").post("/api/overrides/", {"kind": "freeze"}, format="json")
    assert resp.status_code == 201
    assert resp.json()["created_by"] == "u-operator"
    resp = boss.post(
        "/admin/replication/override/add/",
        {
            "kind": "exclude_engine",
            "engine": engine.pk,
            "prefix_keys": "[]",
            "reason": "flaky",
            "active": "on",
        },
    )
    assert resp.status_code == 302, resp.content.decode()[-2000:]
    by_admin = Override.objects.get(kind="exclude_engine")
    assert by_admin.created_by.username == "boss"
    assert [e.actor_label for e in events("override.created")] == ["user:u-operator", "user:boss"]
    assert (
        boss.post(f"/admin/replication/override/{by_admin.pk}/delete/", {"post": "yes"}).status_code
        == 302
    )
    [deleted] = events("override.deleted")
    assert deleted.object_id == str(by_admin.pk) and deleted.before["kind"] == "exclude_engine"


# -- tokens: accounts.services -------------------------------------------------------------------


def test_tokens_issued_by_the_api_and_the_commands_are_audited(client_for, db):
    resp = client_for("admin").post(
        "/api/api-tokens/", {"kind": "gateway", "name": "gw"}, format="json"
    )
    assert resp.status_code == 201, resp.content
    call_command(
        "ensure_user",
        "carol",
        "--password",
        "pw-123456789",
        "--role",
        "viewer",
        "--issue-token",
        "scraper",
        stdout=StringIO(),
    )
    call_command("create_enrolment_token", stdout=StringIO())
    api_event, cli_event = events("token.created")
    assert api_event.after["name"] == "gw" and api_event.actor_label == "user:u-admin"
    assert cli_event.after["user"] == "carol" and cli_event.actor_label == "system"
    [enrolment] = events("enrolment_token.created")
    assert enrolment.reason == "manage.py create_enrolment_token"


def test_revoking_a_token_through_the_api_and_the_admin_is_audited(client_for, boss):
    user = make_user("operator", "dave")
    first, _ = ApiToken.issue(TokenKind.USER, "one", user=user)
    second, _ = ApiToken.issue(TokenKind.USER, "two", user=user)
    assert client_for("admin").post(f"/api/api-tokens/{first.pk}/revoke/").status_code == 200
    resp = boss.post(
        "/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [first.pk, second.pk]}
    )
    assert resp.status_code == 302
    assert ApiToken.objects.filter(pk__in=[first.pk, second.pk], revoked_at=None).count() == 0
    # The second revocation of the first token changes nothing and records nothing.
    assert [(e.object_id, e.actor_label) for e in events("token.revoked")] == [
        (str(first.pk), "user:u-admin"),
        (str(second.pk), "user:boss"),
    ]


def test_the_admin_does_not_issue_tokens_the_caller_never_sees(boss):
    assert boss.get("/admin/accounts/apitoken/add/").status_code == 403
    assert boss.get("/admin/accounts/enrolmenttoken/add/").status_code == 403


def test_job_states_change_in_the_admin_only_through_cancel(boss, engine):
    job = ReplicationJob.objects.create(
        target=engine, prefix_keys=["01"], bytes=1, state="succeeded"
    )
    resp = boss.post(
        "/admin/replication/replicationjob/",
        {"action": "cancel_jobs", "_selected_action": [str(job.pk)]},
        follow=True,
    )
    assert "succeeded -&gt; cancelled is not allowed" in resp.content.decode()
    job.refresh_from_db()
    assert job.state == "succeeded" and not events("job.cancelled")
    assert (
        boss.post(
            f"/admin/replication/replicationjob/{job.pk}/change/", {"state": "cancelled"}
        ).status_code
        == 403
    )


def test_plans_are_decided_in_the_admin_through_the_same_service(boss, engine):
    from controlplane.replication.models import PlanItem

    plan = ReplicationPlan.objects.create(policy=Policy.objects.get(active=True), mode="manual")
    item = PlanItem.objects.create(
        plan=plan,
        prefix_keys=["01"],
        target=engine,
        bytes=1,
        expected_ttft_saved_s=1.0,
        cost_s=0.1,
        confidence=0.9,
    )
    resp = boss.post(
        "/admin/replication/replicationplan/",
        {"action": "reject_plans", "_selected_action": [plan.pk]},
    )
    assert resp.status_code == 302
    plan.refresh_from_db()
    item.refresh_from_db()
    assert plan.state == "rejected" and item.decision == "rejected"
    assert plan.decided_by.username == "boss"
    [event] = events("plan.rejected")
    assert event.actor_label == "user:boss" and event.after["items"] == [item.pk]
    assert (
        boss.post(
            f"/admin/replication/replicationplan/{plan.pk}/change/", {"state": "approved"}
        ).status_code
        == 403
    )


# -- filtersets: the API and the pages filter the same way ------------------------------------


def test_a_bad_filter_value_is_a_400_naming_the_field(client_for):
    resp = client_for("viewer").get("/api/replication-jobs/?state=bogus")
    assert resp.status_code == 400
    body = resp.json()
    assert body["error"] == "invalid" and body["field"] == "state" and "bogus" in body["detail"]


def test_the_jobs_page_uses_the_api_filterset(engine):
    ReplicationJob.objects.create(target=engine, prefix_keys=["01"], bytes=1, state="failed")
    ReplicationJob.objects.create(
        target=engine, prefix_keys=["02"], bytes=1, state="running", transport="nccl"
    )
    page = Client()
    page.force_login(make_user("viewer", "vic"))
    html = page.get("/jobs/?state=failed").content.decode()
    assert html.count("data-job=") == 1 and "state-failed" in html
    # A filter the page has no control for still means what it means on the API.
    html = page.get("/jobs/?transport=nccl").content.decode()
    assert html.count("data-job=") == 1 and "state-running" in html
    resp = page.get("/jobs/?state=bogus")
    assert resp.status_code == 400
    html = resp.content.decode()
    assert 'id="filter-error"' in html and "state:" in html and "data-job=" not in html


def test_the_audit_page_uses_the_api_filterset(db):
    AuditEvent.objects.create(
        actor_label="system",
        action="policy.created",
        object_type="replication.policy",
        object_id="1",
    )
    AuditEvent.objects.create(
        actor_label="system", action="node.updated", object_type="fleet.node", object_id="7"
    )
    page = Client()
    page.force_login(make_user("operator", "olga"))
    html = page.get("/audit/?object_id=7").content.decode()
    assert "fleet.node#7" in html and "replication.policy#1" not in html
    assert page.get("/audit/?since=not-a-date").status_code == 400


# -- domain errors ----------------------------------------------------------------------------


def test_domain_errors_carry_their_status_and_map_to_the_usual_body():
    from controlplane.api.exceptions import exception_handler

    err = Conflict("no", code="busy", field="x")
    assert isinstance(err, DomainError) and err.status == 409
    response = exception_handler(err, {})
    assert response.status_code == 409
    assert response.data == {"error": "busy", "detail": "no", "field": "x"}
    assert DomainError("bad").body() == {"error": "invalid", "detail": "bad", "field": None}


def test_an_illegal_job_transition_is_a_409_on_state(client_for, engine):
    job = ReplicationJob.objects.create(
        target=engine, prefix_keys=["01"], bytes=1, state="succeeded"
    )
    resp = client_for("operator").post(f"/api/replication-jobs/{job.pk}/cancel/", {}, format="json")
    assert resp.status_code == 409
    assert resp.json()["error"] == "illegal_transition" and resp.json()["field"] == "state"


def test_views_pages_and_commands_write_the_audit_trail_only_through_services():
    """The audit trail is written by service functions; the API views, the pages and the
    management commands call those (a direct audit.record there is a second mechanism)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    callers = [
        *root.glob("controlplane/*/api/*.py"),
        *root.glob("frontend/*.py"),
        *root.glob("controlplane/*/management/commands/*.py"),
    ]
    assert len(callers) > 20
    direct = [
        str(p.relative_to(root)) for p in callers if "controlplane.audit.services" in p.read_text()
    ]
    assert direct == []
