import axes.admin  # noqa: F401  (registers axes' models first, so the one below replaces it)
from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt
from django.contrib import admin

from . import services
from .lockout import unlock
from .models import ApiToken, EnrolmentToken


class IssuedElsewhere:
    """Tokens are issued by the API or manage.py, which show the raw token once and audit it;
    here they are read, and API tokens revoked (audited too)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(IssuedElsewhere, admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "prefix",
        "user",
        "node",
        "created_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = ("kind",)
    exclude = ("digest",)
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.revoke_api_token(token, request, reason="admin")
        self.message_user(request, f"Revoked {queryset.count()} token(s).")


@admin.register(EnrolmentToken)
class EnrolmentTokenAdmin(IssuedElsewhere, admin.ModelAdmin):
    list_display = ("prefix", "created_at", "expires_at", "uses", "max_uses", "used_at", "node")
    exclude = ("digest",)


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
