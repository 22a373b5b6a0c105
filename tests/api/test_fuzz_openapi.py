"""Schemathesis over the whole OpenAPI schema, with every kind of credential: never a 5xx.

Every generated request runs inside the test's transaction, so nothing it writes survives.
"""

import pytest
import schemathesis
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


def test_no_server_errors_with_any_credentials(api_schema, credentials):
    # schemathesis' own pytest plugin does not load under pytest 9, so drive hypothesis here:
    # every operation, every credential kind.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 30

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def fuzz(case):
            for name, header in credentials.items():
                response = case.call(headers={"Authorization": header} if header else {})
                case.validate_response(response, checks=[not_a_server_error])
                if response.status_code < 300 and name == "admin":
                    case.validate_response(response, checks=[response_schema_conformance])

        fuzz()
