import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken, EnrolmentToken

ROLES = ("viewer", "operator", "admin")


def make_user(role: str | None, name: str | None = None) -> User:
    user = User.objects.create_user(name or f"u-{role}", password="pw-123456789")
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def client_for(db):
    """client_for('operator') -> APIClient authenticated as a user of that role (or None)."""

    def build(role: str | None) -> APIClient:
        client = APIClient()
        if role == "anonymous":
            return client
        client.force_authenticate(make_user(None if role == "norole" else role))
        return client

    return build


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def enrol(db):
    """enrol('node-a') -> (node_id, APIClient with that node's agent token)."""

    def build(hostname: str = "node-a", labels: dict | None = None):
        _, raw = EnrolmentToken.issue(labels=labels or {})
        resp = APIClient().post(
            "/api/agents/enrol/", {"enrolment_token": raw, "hostname": hostname}, format="json"
        )
        assert resp.status_code == 201, resp.content
        return resp.json()["node_id"], bearer(resp.json()["agent_token"])

    return build


@pytest.fixture
def gateway(db):
    _, raw = ApiToken.issue(TokenKind.GATEWAY, "gw-1")
    return bearer(raw)
