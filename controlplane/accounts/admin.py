from django.contrib import admin

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
