"""Token writes: issuing and revoking API and enrolment tokens, each audited here.

The views, the management commands and the admin call these, so every path leaves the same
audit record."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from controlplane.audit.services import record
from controlplane.realtime import groups
from controlplane.realtime.publish import publish

from .choices import TokenKind
from .models import ApiToken, EnrolmentToken, digest

# The message a node's channel group is sent when tokens of the node stop working: its sockets
# holding one of them close (4401) and its waiting long-polls answer 401 (controlplane/agentapi).
AGENT_REVOKED = "agent.revoked"


def close_agent_channels(node_id: int, token_ids: list[int]) -> None:
    """Once the transaction commits, end every open socket and long-poll of node ``node_id``
    authenticated by one of ``token_ids``: revocation reaches channels already open."""
    if token_ids:
        publish(groups.agent(node_id), AGENT_REVOKED, {"tokens": sorted(token_ids)})


def revoke_node_tokens(node_id: int, *, only: ApiToken | None = None) -> list[ApiToken]:
    """Revoke the node's usable agent tokens (``only``: that one) now and close their channels
    on commit; returns the tokens revoked. The caller audits (it knows why)."""
    tokens = ApiToken.objects.select_for_update().filter(
        node_id=node_id, kind=TokenKind.AGENT, revoked_at__isnull=True
    )
    if only is not None:
        tokens = tokens.filter(pk=only.pk)
    revoked = list(tokens)
    ApiToken.objects.filter(pk__in=[t.pk for t in revoked]).update(revoked_at=timezone.now())
    close_agent_channels(node_id, [t.pk for t in revoked])
    return revoked


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
        if token.node_id is not None:
            close_agent_channels(token.node_id, [token.pk])
    return token


@transaction.atomic
def issue_enrolment_token(
    who,
    ttl_s: int | None = None,
    *,
    labels: dict | None = None,
    created_by=None,
    max_uses: int = 1,
    node_name: str = "",
    reason: str = "",
) -> tuple[EnrolmentToken, str]:
    """An enrolment token good for ``max_uses`` agents (1: one-time); returns it with the raw
    token (shown once). ``node_name``: bound to that name, which it may also re-enrol (a
    reinstalled host whose agent lost its state)."""
    token, raw = EnrolmentToken.issue(
        ttl_s,
        labels=labels or {},
        created_by=created_by,
        max_uses=max_uses,
        node_name=node_name,
    )
    record(who, "enrolment_token.created", token, after=_enrolment_state(token), reason=reason)
    return token, raw


FLEET_TOKEN_MIN_CHARS = 40


@transaction.atomic
def ensure_fleet_enrolment_token(
    who, raw: str, ttl_s: int, *, max_uses: int, labels: dict | None = None, reason: str = ""
) -> tuple[EnrolmentToken, bool]:
    """Register a fleet enrolment token whose raw value was made elsewhere (a Helm chart's
    Secret), or, if it is known, set its bound and expiry to these (an upgrade renews them; its
    uses so far still count). Returns the token and whether it was created."""
    if not raw.startswith("pwe_") or len(raw) < FLEET_TOKEN_MIN_CHARS:
        raise ValueError(f"a fleet enrolment token is pwe_ and {FLEET_TOKEN_MIN_CHARS}+ characters")
    expires_at = timezone.now() + timezone.timedelta(seconds=ttl_s)
    token = EnrolmentToken.objects.select_for_update().filter(digest=digest(raw)).first()
    if token is None:
        token, _ = EnrolmentToken.issue(ttl_s, raw=raw, labels=labels or {}, max_uses=max_uses)
        record(who, "enrolment_token.created", token, after=_enrolment_state(token), reason=reason)
        return token, True
    before = _enrolment_state(token)
    token.max_uses, token.expires_at, token.labels = max_uses, expires_at, labels or {}
    token.save(update_fields=["max_uses", "expires_at", "labels"])
    after = _enrolment_state(token)
    record(who, "enrolment_token.updated", token, before=before, after=after, reason=reason)
    return token, False


def _enrolment_state(token: EnrolmentToken) -> dict:
    return {
        "prefix": token.prefix,
        "expires_at": token.expires_at.isoformat(),
        "max_uses": token.max_uses,
        "labels": token.labels,
        "node_name": token.node_name,
    }
