"""Bearer-token authentication for automation, gateway and agent tokens.

Agents are authenticated one way, ``authenticate_agent``: by their report and heartbeat views
(``AgentTokenAuthentication``), the jobs long-poll and the jobs websocket (controlplane/agentapi).
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from rest_framework import authentication, exceptions

from .choices import TokenKind
from .models import ApiToken, digest

INVALID_TOKEN = "invalid, expired or revoked token"
RETIRED = "retired"  # fleet's NodeState.RETIRED (accounts sits below fleet)
AGENT_TOKEN_REQUIRED = "an agent token is required (Authorization: Bearer ...)"
NOT_AN_AGENT = "your role does not allow this"  # RolePermission's answer to other tokens


def token_from_header(value: str | None) -> str | None:
    if not value:
        return None
    parts = value.split()
    if len(parts) != 2 or parts[0].lower() not in ("bearer", "token"):
        return None
    return parts[1]


def resolve_token(raw: str) -> ApiToken | None:
    """The usable token for a raw value, or None."""
    token = ApiToken.objects.select_related("user", "node").filter(digest=digest(raw)).first()
    if token is None or not token.usable:
        return None
    now = timezone.now()
    # Touch last_used at most once a minute: a 1 Hz agent must not write on every report.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


class AgentAuthFailed(Exception):
    """Not an agent: ``status`` 401 (no usable token) or 403 (a token, but not an agent's)."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def authenticate_agent(authorization: str | None) -> ApiToken:
    """The agent token an ``Authorization`` header carries (bound to its node), or AgentAuthFailed.

    The header only: a token in a URL would end up in proxy and access logs.
    """
    raw = token_from_header(authorization)
    if raw is None:
        raise AgentAuthFailed(401, AGENT_TOKEN_REQUIRED)
    token = resolve_token(raw)
    if token is None:
        raise AgentAuthFailed(401, INVALID_TOKEN)
    if token.kind != TokenKind.AGENT or token.node_id is None:
        raise AgentAuthFailed(403, NOT_AN_AGENT)
    if token.node.state == RETIRED:  # retiring revokes its tokens; this holds whatever did not
        raise AgentAuthFailed(401, INVALID_TOKEN)
    return token


def agent_token_live(token_id: int) -> bool:
    """Whether the agent token ``token_id`` still works (not revoked, expired or retired): what
    an open socket checks before it sends a job or applies an event."""
    token = ApiToken.objects.select_related("node").filter(pk=token_id).first()
    return token is not None and token.usable and token.node.state != RETIRED


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """DRF's face of ``authenticate_agent`` for the agents' views; request.auth is the ApiToken."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if token_from_header(header) is None:
            return None  # no bearer token: 401 unless a later class (a session) authenticates
        try:
            return (AnonymousUser(), authenticate_agent(header))
        except AgentAuthFailed as exc:
            if exc.status == 401:
                raise exceptions.AuthenticationFailed(exc.detail) from None
            raise exceptions.PermissionDenied(exc.detail) from None

    def authenticate_header(self, request):
        return "Bearer"


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`; request.auth is the ApiToken."""

    def authenticate(self, request):
        raw = token_from_header(request.META.get("HTTP_AUTHORIZATION"))
        if raw is None:
            return None
        token = resolve_token(raw)
        if token is None:
            raise exceptions.AuthenticationFailed(INVALID_TOKEN)
        user = token.user if token.kind == TokenKind.USER and token.user else AnonymousUser()
        if token.kind == TokenKind.USER and (token.user is None or not token.user.is_active):
            raise exceptions.AuthenticationFailed("token's user is inactive")
        return (user, token)

    def authenticate_header(self, request):
        return "Bearer"
