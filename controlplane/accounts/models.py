"""API tokens (stored hashed) and agent enrolment tokens (one-time, or a bounded fleet token)."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from .choices import TokenKind


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for automation, a gateway or an agent; only its SHA-256 is stored."""

    kind = models.CharField(max_length=16, choices=TokenKind.CHOICES)
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="first characters, to recognise it")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_tokens",
    )
    node = models.ForeignKey(
        "fleet.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="tokens"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, kind: str, name: str, **fields) -> tuple[ApiToken, str]:
        """Create a token; the raw value is returned once and never stored."""
        raw = TokenKind.PREFIX[kind] + secrets.token_urlsafe(32)
        token = cls.objects.create(
            kind=kind, name=name, digest=digest(raw), prefix=raw[:10], **fields
        )
        return token, raw

    def usable_at(self, now) -> bool:
        return self.uses < self.max_uses and self.expires_at > now

    @property
    def usable(self) -> bool:
        now = timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class EnrolmentToken(models.Model):
    """An expiring token agents trade for node tokens, ``max_uses`` times (1: single-use)."""

    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    # A fleet token (max_uses > 1) lets a DaemonSet or a fleet of sidecars enrol without a token
    # made by hand per pod; the bound caps what a leaked one can enrol before it expires.
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True, help_text="labels given to the node")
    node_name = models.CharField(
        max_length=200,
        blank=True,
        help_text="bound to this node name: enrols only it, and may re-enrol it (a reinstall)",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True, help_text="the latest use")
    node = models.ForeignKey(
        "fleet.Node",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="the node of the latest use",
    )

    def __str__(self) -> str:
        return f"enrolment {self.prefix}…"

    @classmethod
    def issue(
        cls, ttl_s: int | None = None, *, raw: str | None = None, **fields
    ) -> tuple[EnrolmentToken, str]:
        """Create a token (``raw`` given: one generated elsewhere, e.g. by a Helm chart)."""
        ttl = ttl_s or settings.PREWARM_ENROLMENT_TOKEN_TTL_SECONDS
        raw = raw or "pwe_" + secrets.token_urlsafe(32)
        token = cls.objects.create(
            digest=digest(raw),
            prefix=raw[:10],
            expires_at=timezone.now() + timezone.timedelta(seconds=ttl),
            **fields,
        )
        return token, raw

    def usable_at(self, now) -> bool:
        return self.uses < self.max_uses and self.expires_at > now
