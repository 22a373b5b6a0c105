"""Schemathesis over the whole OpenAPI schema, with every kind of credential: never a 5xx, and a
refused request (any 4xx) changes nothing in the database.

Every generated request runs inside the test's transaction, so nothing it writes survives.
"""

import hashlib

import pytest
import schemathesis
from django.db import connection
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken

from .conftest import make_user

pytestmark = pytest.mark.slow


@pytest.fixture
def api_schema(credentials, monkeypatch):
    # After `credentials`: Django's test client reconnects close_old_connections when it is done.
    import channels.db
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    from controlplane.wsgi import application

    # As Django's test client does: neither the WSGI handler nor channels' database_sync_to_async
    # (the long-poll view uses it) may close the connection that holds the test's transaction.
    monkeypatch.setattr(channels.db, "close_old_connections", lambda: None)
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield schemathesis.openapi.from_wsgi("/api/schema/", application)
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def credentials(enrol, db):
    admin = make_user("admin", "fuzz-admin")
    viewer = make_user("viewer", "fuzz-viewer")
    _, agent = enrol("fuzz-node")
    return {
        "admin": f"Bearer {ApiToken.issue(TokenKind.USER, 'a', user=admin)[1]}",
        "viewer": f"Bearer {ApiToken.issue(TokenKind.USER, 'v', user=viewer)[1]}",
        "gateway": f"Bearer {ApiToken.issue(TokenKind.GATEWAY, 'g')[1]}",
        "agent": agent._credentials["HTTP_AUTHORIZATION"],
        "none": None,
    }


# Written by authentication itself (at most once a minute), not by the request's effect.
IGNORED_COLUMNS = {"last_used_at", "last_login"}


def database_fingerprint() -> str:
    """A digest of every row of every table (the fuzz world is small)."""
    digest = hashlib.sha256()
    with connection.cursor() as cur:
        for table in sorted(connection.introspection.table_names(cur)):
            if table.startswith("django_session"):
                continue
            cur.execute(f'SELECT * FROM "{table}" ORDER BY 1')  # noqa: S608 - names from introspection
            columns = [c[0] for c in cur.description]
            keep = [i for i, c in enumerate(columns) if c not in IGNORED_COLUMNS]
            digest.update(table.encode())
            for row in cur.fetchall():
                digest.update(repr([row[i] for i in keep]).encode())
    return digest.hexdigest()


def test_no_server_errors_with_any_credentials(api_schema, credentials):
    # schemathesis' own pytest plugin does not load under pytest 9, so drive hypothesis here:
    # every operation, every credential kind.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 30

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def fuzz(case):
            for name, header in credentials.items():
                before = database_fingerprint() if case.method.upper() != "GET" else None
                response = case.call(headers={"Authorization": header} if header else {})
                case.validate_response(response, checks=[not_a_server_error])
                if before is not None and 400 <= response.status_code < 500:
                    assert database_fingerprint() == before, (
                        f"refused {case.method} {case.formatted_path} as {name} "
                        f"({response.status_code}) changed the database"
                    )
                if response.status_code < 300 and name == "admin":
                    case.validate_response(response, checks=[response_schema_conformance])

        fuzz()


def test_the_fingerprint_sees_an_update_and_ignores_token_use(db, credentials):
    from controlplane.replication.models import Policy

    before = database_fingerprint()
    ApiToken.objects.update(last_used_at="2026-01-01T00:00:00Z")
    assert database_fingerprint() == before
    Policy.objects.update(min_confidence=0.123)
    assert database_fingerprint() != before
