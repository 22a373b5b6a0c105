"""The one way to write the audit trail."""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.forms.models import model_to_dict

from .models import AuditEvent


def snapshot(obj: models.Model | None) -> dict[str, Any] | None:
    """A JSON-safe dict of a model's fields, for before/after."""
    if obj is None:
        return None
    data = model_to_dict(obj)
    return {k: _json_safe(v) for k, v in data.items()}


def _json_safe(value: Any) -> Any:
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool, dict, type(None))):
        return value
    return str(value)


def actor_of(request_or_user: Any) -> tuple[Any, str]:
    """(user or None, label) for a request, a user, or None (the system)."""
    user = getattr(request_or_user, "user", request_or_user)
    token = getattr(request_or_user, "auth", None)
    token_name = getattr(token, "name", None)
    if user is not None and getattr(user, "is_authenticated", False):
        label = f"user:{user.get_username()}"
        if token_name:
            label += f" (token:{token_name})"
        return user, label
    if token_name:
        return None, f"token:{token_name}"
    return None, "system"


def record(
    who: Any,
    action: str,
    obj: models.Model | None = None,
    *,
    before: dict | None = None,
    after: dict | None = None,
    reason: str = "",
    object_type: str | None = None,
    object_id: str | None = None,
    actor_label: str | None = None,
) -> AuditEvent:
    """Write one AuditEvent inside the caller's transaction (``actor_label`` names an actor
    without an account, e.g. ``anonymous@10.0.0.5`` for a failed sign-in)."""
    user, label = actor_of(who)
    label = actor_label or label
    return AuditEvent.objects.create(
        actor=user,
        actor_label=label,
        action=action,
        object_type=object_type or (obj._meta.label_lower if obj is not None else ""),
        object_id=object_id or (str(obj.pk) if obj is not None else ""),
        before=before,
        after=after,
        reason=reason,
    )


def stored_snapshot(obj: models.Model) -> dict[str, Any] | None:
    """The snapshot of ``obj`` as the database holds it now (None for a new object)."""
    if obj.pk is None:
        return None
    return snapshot(type(obj)._default_manager.filter(pk=obj.pk).first())


@transaction.atomic
def save_audited(
    obj: models.Model,
    who: Any,
    action: str,
    *,
    reason: str = "",
    update_fields: list[str] | None = None,
) -> models.Model:
    """Save ``obj`` (fields already set) and record the stored state before and after, in one
    transaction. ``update_fields`` writes only those (a row agents also write, e.g. a node)."""
    before = stored_snapshot(obj)
    obj.save(update_fields=update_fields)
    record(who, action, obj, before=before, after=snapshot(obj), reason=reason)
    return obj


@transaction.atomic
def delete_audited(obj: models.Model, who: Any, action: str, *, reason: str = "") -> None:
    """Delete ``obj`` and record what it was, in one transaction."""
    record(who, action, obj, before=snapshot(obj), reason=reason)
    obj.delete()


@transaction.atomic
def prune_audit(now=None) -> dict:
    """Events older than the admin-set horizon (PREWARM_AUDIT_KEEP_DAYS; 0 keeps everything)."""
    from datetime import timedelta

    from axes.models import AccessAttempt, AccessLog
    from django.conf import settings
    from django.utils import timezone

    days = settings.PREWARM_AUDIT_KEEP_DAYS
    now = now or timezone.now()
    # Failed sign-in counts past the cool-off decide nothing any more (django-axes ignores them).
    attempts, _ = AccessAttempt.objects.filter(
        attempt_time__lt=now - timedelta(seconds=settings.PREWARM_LOGIN_COOLOFF_SECONDS)
    ).delete()
    if days <= 0:
        return {"audit_events_deleted": 0, "sign_in_attempts_deleted": attempts}
    cutoff = now - timedelta(days=days)
    deleted, _ = AuditEvent.objects.filter(at__lt=cutoff).delete()
    # django-axes' log of successful sign-ins is kept as long as the audit trail.
    sign_ins, _ = AccessLog.objects.filter(attempt_time__lt=cutoff).delete()
    if deleted:  # the trail says it was trimmed, and by which rule
        record(
            None,
            "audit.pruned",
            object_type="audit.auditevent",
            reason=f"{deleted} events older than {days:g} days (PREWARM_AUDIT_KEEP_DAYS)",
        )
    return {
        "audit_events_deleted": deleted,
        "sign_ins_deleted": sign_ins,
        "sign_in_attempts_deleted": attempts,
    }
