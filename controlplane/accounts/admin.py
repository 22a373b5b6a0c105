import axes.admin  # noqa: F401  (registers axes' models first, so the one below replaces it)
from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt
from django.contrib import admin

from .lockout import unlock
from .models import ApiToken, EnrolmentToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "prefix", "user", "node", "created_at", "expires_at", "revoked_at")
    list_filter = ("kind",)
    readonly_fields = ("digest", "prefix", "last_used_at")


@admin.register(EnrolmentToken)
class EnrolmentTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "created_at", "expires_at", "used_at", "node")
    readonly_fields = ("digest", "prefix", "used_at", "node")


if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)


@admin.register(AccessAttempt)
class SignInAttemptAdmin(AccessAttemptAdmin):
    """Failed sign-ins per user name and address; the unlock action clears them, audited."""

    actions = ["unlock_sign_in", *AccessAttemptAdmin.actions]

    @admin.action(description="Unlock sign-in (clear these failed attempts)")
    def unlock_sign_in(self, request, queryset):
        n = unlock(request, queryset)
        self.message_user(request, f"Unlocked {n} user name / address pair(s).")
