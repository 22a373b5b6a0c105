"""Token writes: issuing and revoking API and enrolment tokens, each audited here.

The views, the management commands and the admin call these, so every path leaves the same
audit record."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from controlplane.audit.services import record

from .models import ApiToken, EnrolmentToken


@transaction.atomic
def issue_api_token(
    who, kind: str, name: str, *, user=None, expires_at: datetime | None = None, reason: str = ""
) -> tuple[ApiToken, str]:
    """A new user or gateway token; returns it with the raw token (shown once)."""
    token, raw = ApiToken.issue(kind, name, user=user, expires_at=expires_at)
    after = {"kind": token.kind, "name": token.name, "prefix": token.prefix}
    if user is not None:
        after["user"] = user.get_username()
    record(who, "token.created", token, after=after, reason=reason)
    return token, raw


@transaction.atomic
def revoke_api_token(token: ApiToken, who, *, reason: str = "") -> ApiToken:
    """Revoke ``token`` now; revoking a revoked token changes (and records) nothing."""
    token = ApiToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        record(who, "token.revoked", token, after={"prefix": token.prefix}, reason=reason)
    return token


@transaction.atomic
def issue_enrolment_token(
    who,
    ttl_seconds: int | None = None,
    *,
    labels: dict | None = None,
    created_by=None,
    reason: str = "",
) -> tuple[EnrolmentToken, str]:
    """A one-time enrolment token for an agent; returns it with the raw token (shown once)."""
    token, raw = EnrolmentToken.issue(ttl_seconds, labels=labels or {}, created_by=created_by)
    after = {"prefix": token.prefix, "expires_at": token.expires_at.isoformat()}
    record(who, "enrolment_token.created", token, after=after, reason=reason)
    return token, raw
