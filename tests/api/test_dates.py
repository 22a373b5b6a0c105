"""Date-time query parameters outside what the database stores are a 400, never a 500."""

from datetime import UTC, datetime

import pytest


@pytest.mark.parametrize(
    "value", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "not-a-date"]
)
def test_out_of_range_dates_are_refused(client_for, value):
    operator = client_for("operator")
    assert operator.get("/api/audit-events/", {"since": value}).status_code == 400
    assert operator.get("/api/scoreboard/", {"since": value}).status_code == 400


def test_a_sane_date_filters(client_for):
    from controlplane.audit.models import AuditEvent

    old, new = (
        AuditEvent.objects.create(actor_label="system", action=a, object_type="t")
        for a in ("old", "new")
    )
    AuditEvent.objects.filter(pk=old.pk).update(at="2025-12-31T23:59:59Z")
    AuditEvent.objects.filter(pk=new.pk).update(at="2026-01-01T00:00:00Z")  # the bound itself is in
    resp = client_for("operator").get("/api/audit-events/", {"since": "2026-01-01T00:00:00Z"})
    assert resp.status_code == 200
    actions = {e["action"] for e in resp.json()["results"]}
    assert "new" in actions and "old" not in actions


def test_the_scoreboard_window_is_the_one_asked_for(client_for):
    resp = client_for("operator").get(
        "/api/scoreboard/", {"since": "2026-01-01T00:00:00Z", "until": "2026-01-02T00:00:00+02:00"}
    )
    assert resp.status_code == 200
    window = {k: datetime.fromisoformat(v) for k, v in resp.json()["window"].items()}
    assert window == {
        "since": datetime(2026, 1, 1, tzinfo=UTC),
        "until": datetime(2026, 1, 1, 22, tzinfo=UTC),
    }


def test_an_offset_beyond_what_postgresql_stores_is_the_instant_it_names(client_for):
    """Python takes offsets up to 24 h, PostgreSQL up to 15:59: found by the schema fuzzer."""
    operator = client_for("operator")
    resp = operator.get("/api/audit-events/", {"since": "2290-07-25T06:57:00-20:08"})
    assert resp.status_code == 200 and resp.json()["results"] == []
    resp = operator.get(
        "/api/scoreboard/", {"since": "2026-01-01T00:00:00-20:08", "until": "2026-01-03T00:00:00Z"}
    )
    assert resp.status_code == 200
    assert datetime.fromisoformat(resp.json()["window"]["since"]) == datetime(
        2026, 1, 1, 20, 8, tzinfo=UTC
    )


@pytest.mark.parametrize(
    "query", [{"limit": "40829804512897751056384"}, {"offset": "40829804512897751056384"}]
)
def test_a_limit_or_offset_beyond_a_bigint_is_bounded_not_a_500(client_for, query):
    resp = client_for("operator").get("/api/nodes/", query)
    assert resp.status_code == 200 and resp.json()["results"] == []
