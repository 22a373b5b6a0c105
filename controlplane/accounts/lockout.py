"""Sign-in throttling (django-axes) wired to Prewarm: the audit trail, the lockout page, the client.

django-axes counts failed sign-ins in the database (shared by every web process) per (user name,
client address) pair and per client address (``AXES_LOCKOUT_PARAMETERS``). The pair is locked at
``PREWARM_LOGIN_FAILURE_LIMIT`` failures, the address at the higher
``PREWARM_LOGIN_ADDRESS_FAILURE_LIMIT``, each for ``PREWARM_LOGIN_COOLOFF_SECONDS``: guessing at one
account locks only the guesser's address out of that account (its owner signs in from elsewhere,
other users from the same address sign in), and a spray over many names from one address still
stops. It guards ``django.contrib.auth.authenticate``, so the dashboard's ``/login/`` and the
admin's ``/admin/login/``; API tokens never call it and are unaffected. This module adds what
Prewarm needs around it:

- ``AuditingAxesHandler`` applies the two limits (axes compares one count with one limit), resets
  only the pair on a successful sign-in (a sprayer's own account must not clear its address's
  count), and writes the first failure of a burst and every lockout to the audit log;
- ``lockout_response`` answers a locked sign-in with the sign-in page, a clear message, 429 and
  ``Retry-After``;
- ``client_ip`` reads the client address behind ``PREWARM_TRUSTED_PROXY_COUNT`` proxies, so a load
  balancer's address does not lock everybody out at once.
"""

from __future__ import annotations

import logging
import math

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Sum
from django.shortcuts import render

from controlplane.audit.services import record

log = logging.getLogger(__name__)


def client_ip(request) -> str | None:
    """The client's address: REMOTE_ADDR, or the one the Nth trusted proxy saw."""
    hops = settings.PREWARM_TRUSTED_PROXY_COUNT
    if hops > 0:
        # Each proxy appends the address it received from; the first N from the right are ours,
        # anything further left was written by the client and cannot be trusted.
        chain = [
            p.strip() for p in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if p.strip()
        ]
        if len(chain) >= hops:
            return chain[-hops]
    return request.META.get("REMOTE_ADDR")


def cooloff_text(seconds: float) -> str:
    if seconds >= 120:
        return f"{math.ceil(seconds / 60)} minutes"
    return f"{math.ceil(seconds)} seconds"


def lockout_message(seconds: float) -> str:
    return (
        "Too many failed sign-ins for this user name from this address, or from this address: "
        "sign-in is locked for "
        f"{cooloff_text(seconds)}. An admin can unlock it sooner."
    )


def lockout_response(request, original_response=None, credentials=None):
    """The sign-in page again, saying why and for how long; HTTP 429 with Retry-After."""
    # axes' async middleware passes (request, credentials): read nothing from the other arguments.
    cool_off = get_cool_off(request)
    seconds = cool_off.total_seconds() if cool_off else 0
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    resp = render(
        request,
        "frontend/login.html",
        {"form": form, "locked": lockout_message(seconds), "next": request.POST.get("next", "")},
        status=429,
    )
    if seconds:
        resp["Retry-After"] = str(math.ceil(seconds))
    return resp


def _subject(username: str | None) -> tuple[str, str]:
    user = get_user_model().objects.filter(username=username).first() if username else None
    return ("auth.user", str(user.pk)) if user else ("auth.user", "")


class AuditingAxesHandler(AxesDatabaseHandler):
    """axes' database handler with a limit per pair and a higher one per address, plus the audit
    trail: a burst's first failure, and each lockout."""

    def get_failures(self, request, credentials: dict | None = None) -> int:
        """The pair's failures, or the pair limit when the address has reached its own limit.

        axes locks when this reaches ``AXES_FAILURE_LIMIT`` (the pair limit), both when it
        records a failure and when it checks a sign-in (``is_locked``), so this one answer carries
        both thresholds."""
        pair, address = (
            attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
            for attempts in self.get_user_attempts(request, credentials)
        )
        if address >= settings.PREWARM_LOGIN_ADDRESS_FAILURE_LIMIT:
            return max(pair, get_failure_limit(request, credentials))
        return pair

    def reset_user_attempts(self, request, credentials: dict | None = None) -> int:
        """A successful sign-in clears its own pair's failures, not its address's."""
        pair = self.filter_user_attempts(request, credentials)[0]
        deleted, _ = pair.delete()
        return deleted

    def user_login_failed(self, sender, credentials: dict, request=None, **kwargs):
        already_locked = bool(getattr(request, "axes_locked_out", False))
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is None or already_locked:
            return  # refused while locked: counted by axes, audited once at the lockout
        failures = getattr(request, "axes_failures_since_start", None) or 0
        locked = bool(getattr(request, "axes_locked_out", False))
        if failures == 1 or locked:
            self._audit(request, credentials, failures, locked)

    def _audit(self, request, credentials: dict, failures: int, locked: bool) -> None:
        username = (get_client_username(request, credentials) or "")[:150]
        ip = getattr(request, "axes_ip_address", None) or ""
        path = getattr(request, "axes_path_info", "") or request.path
        cool_off = get_cool_off(request)
        object_type, object_id = _subject(username)
        after = {"username": username, "ip_address": ip, "path": path, "failures": failures}
        if locked:
            after["cooloff_seconds"] = cool_off.total_seconds() if cool_off else None
            reason = (
                f"{failures} failed sign-ins for {username!r} from {ip}, or from {ip}: locked out for "
                f"{cooloff_text(after['cooloff_seconds'] or 0)}"
            )
        else:
            reason = f"failed sign-in for {username!r} from {ip} (first of a burst)"
        record(
            None,
            "login.locked_out" if locked else "login.failed",
            object_type=object_type,
            object_id=object_id,
            after=after,
            reason=reason,
            actor_label=f"anonymous@{ip}",
        )
        log.warning("%s", reason)


def unlock(who, attempts) -> int:
    """Clear failed sign-ins (an admin's unlock); one audit event per user name / address."""
    n = 0
    for attempt in attempts:
        object_type, object_id = _subject(attempt.username)
        record(
            who,
            "login.unlocked",
            object_type=object_type,
            object_id=object_id,
            before={
                "username": attempt.username,
                "ip_address": attempt.ip_address,
                "failures": attempt.failures_since_start,
            },
            reason=f"unlocked sign-in for {attempt.username!r} from {attempt.ip_address}",
        )
        attempt.delete()
        n += 1
    return n
