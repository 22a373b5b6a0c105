from django.contrib import admin, messages

from controlplane.audit.admin import ServiceAdmin
from controlplane.core.errors import DomainError

from . import services
from .jobs.delivery import cancel_job
from .models import (
    JobTransition,
    Override,
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from .plans.decisions import decide_plan


@admin.register(Policy)
class PolicyAdmin(ServiceAdmin):
    list_display = (
        "name",
        "active",
        "mode",
        "max_spec_vram_fraction",
        "max_bytes_per_interval",
        "min_confidence",
    )

    def save_with(self, request, obj, form, change):
        services.save_policy(obj, request, reason="admin")

    def delete_with(self, request, obj):
        services.delete_policy(obj, request, reason="admin")


@admin.register(Override)
class OverrideAdmin(ServiceAdmin):
    list_display = ("kind", "node", "engine", "active", "expires_at", "created_by")
    list_filter = ("kind", "active")

    def save_with(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        services.save_override(obj, request, reason="admin")

    def delete_with(self, request, obj):
        services.delete_override(obj, request, reason="admin")


def _decide(modeladmin, request, queryset, approve: bool):
    for plan in queryset:
        _, refused = decide_plan(plan.pk, request, approve, reason="admin")
        for item, why in refused.items():
            modeladmin.message_user(request, f"plan {plan.pk} item {item}: {why}", messages.WARNING)


@admin.action(description="Approve the selected plans (budgets enforced)")
def approve_plans(modeladmin, request, queryset):
    _decide(modeladmin, request, queryset, True)


@admin.action(description="Reject the selected plans")
def reject_plans(modeladmin, request, queryset):
    _decide(modeladmin, request, queryset, False)


@admin.action(description="Cancel the selected jobs")
def cancel_jobs(modeladmin, request, queryset):
    for job in queryset:
        try:
            cancel_job(job, request, "admin")
        except DomainError as exc:  # a finished job: say so, cancel the others
            modeladmin.message_user(request, exc.detail, messages.WARNING)


class ReadOnly:
    """Rows that change only through the services (decisions, job states): view them here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class PlanItemInline(ReadOnly, admin.TabularInline):
    model = PlanItem
    extra = 0
    fields = (
        "target",
        "source",
        "tier",
        "bytes",
        "expected_ttft_saved_s",
        "confidence",
        "decision",
        "reason",
    )
    readonly_fields = fields


@admin.register(ReplicationPlan)
class ReplicationPlanAdmin(ReadOnly, ServiceAdmin):
    list_display = ("id", "policy", "mode", "state", "created_at")
    list_filter = ("state", "mode")
    inlines = [PlanItemInline]
    actions = [approve_plans, reject_plans]


@admin.register(PlanItem)
class PlanItemAdmin(ReadOnly, admin.ModelAdmin):
    list_display = (
        "id",
        "plan",
        "target",
        "bytes",
        "expected_ttft_saved_s",
        "confidence",
        "decision",
    )
    list_filter = ("decision", "tier")


class JobTransitionInline(ReadOnly, admin.TabularInline):
    model = JobTransition
    extra = 0
    readonly_fields = ("from_state", "to_state", "at", "detail")


@admin.register(ReplicationJob)
class ReplicationJobAdmin(ReadOnly, ServiceAdmin):
    list_display = (
        "id",
        "action",
        "transport",
        "source",
        "target",
        "state",
        "attempt",
        "created_at",
    )
    list_filter = ("state", "action", "transport")
    inlines = [JobTransitionInline]
    actions = [cancel_jobs]  # states change only through jobs.states.transition


@admin.register(SpeculativeReplica)
class SpeculativeReplicaAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "engine",
        "tier",
        "bytes",
        "shadow",
        "placed_at",
        "expires_at",
        "hits",
        "evicted_at",
    )
    list_filter = ("shadow", "tier")
