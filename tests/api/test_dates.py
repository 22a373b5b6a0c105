"""Date-time query parameters outside what the database stores are a 400, never a 500."""

import pytest


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "not-a-date"])
def test_out_of_range_dates_are_refused(client_for, value):
    operator = client_for("operator")
    assert operator.get("/api/audit-events/", {"since": value}).status_code == 400
    assert operator.get("/api/scoreboard/", {"since": value}).status_code == 400


def test_a_sane_date_filters(client_for):
    resp = client_for("operator").get("/api/audit-events/", {"since": "2026-01-01T00:00:00Z"})
    assert resp.status_code == 200
