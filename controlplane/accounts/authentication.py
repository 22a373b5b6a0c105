"""Bearer-token authentication for automation, gateway and agent tokens."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from rest_framework import authentication, exceptions

from .models import ApiToken, digest


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


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`; request.auth is the ApiToken."""

    def authenticate(self, request):
        raw = token_from_header(request.META.get("HTTP_AUTHORIZATION"))
        if raw is None:
            return None
        token = resolve_token(raw)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid, expired or revoked token")
        user = token.user if token.kind == "user" and token.user else AnonymousUser()
        if token.kind == "user" and (token.user is None or not token.user.is_active):
            raise exceptions.AuthenticationFailed("token's user is inactive")
        return (user, token)

    def authenticate_header(self, request):
        return "Bearer"
