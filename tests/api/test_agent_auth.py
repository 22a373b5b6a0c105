"""Agents are authenticated one way (accounts.authentication.authenticate_agent): the report and
heartbeat views and the jobs long-poll answer a missing, an invalid and a non-agent token alike."""

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.authentication import AgentAuthFailed, authenticate_agent
from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken
from tests.api.conftest import bearer
from tests.api.helpers import report


def _raw(client) -> str:
    return client._credentials["HTTP_AUTHORIZATION"].split()[1]


def test_the_one_function_names_the_agents_node_or_says_why_not(enrol):
    node_id, agent = enrol("node-a")
    assert authenticate_agent(f"Bearer {_raw(agent)}").node_id == node_id
    _, gateway = ApiToken.issue(TokenKind.GATEWAY, "gw-1")
    for header, status in (
        (None, 401),
        ("Basic abc", 401),
        ("Bearer pwa_not-a-token", 401),
        (f"Bearer {gateway}", 403),
    ):
        with pytest.raises(AgentAuthFailed) as exc:
            authenticate_agent(header)
        assert exc.value.status == status, header


CALLS = [
    ("post", "/api/agents/report/", lambda: report(1)),
    ("post", "/api/agents/heartbeat/", dict),
    ("get", "/api/agents/jobs/?wait=0", lambda: None),
]


# Transactional: the long-poll is async and reads the database from another thread, which on
# PostgreSQL cannot join the test's transaction.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("method, path, body", CALLS, ids=[p for _, p, _ in CALLS])
def test_every_agent_endpoint_answers_alike(enrol, method, path, body):
    _, agent = enrol("node-a")
    _, gateway = ApiToken.issue(TokenKind.GATEWAY, "gw-1")

    def call(client):
        data = body()
        if method == "get":
            return client.get(path)
        return client.post(path, data, format="json")

    assert call(APIClient()).status_code == 401
    assert call(bearer("pwa_not-a-token")).status_code == 401
    assert call(bearer(gateway)).status_code == 403
    assert call(agent).status_code == 200
