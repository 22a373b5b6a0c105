from django.contrib import admin

from .models import (
    JobTransition,
    Override,
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "active", "mode", "max_spec_vram_fraction", "max_bytes_per_interval", "min_confidence")


@admin.register(Override)
class OverrideAdmin(admin.ModelAdmin):
    list_display = ("kind", "node", "engine", "active", "expires_at", "created_by")
    list_filter = ("kind", "active")


class PlanItemInline(admin.TabularInline):
    model = PlanItem
    extra = 0
    fields = ("target", "source", "tier", "bytes", "expected_ttft_saved_s", "confidence", "decision", "reason")
    readonly_fields = fields


@admin.register(ReplicationPlan)
class ReplicationPlanAdmin(admin.ModelAdmin):
    list_display = ("id", "policy", "mode", "state", "created_at")
    list_filter = ("state", "mode")
    inlines = [PlanItemInline]


@admin.register(PlanItem)
class PlanItemAdmin(admin.ModelAdmin):
    list_display = ("id", "plan", "target", "bytes", "expected_ttft_saved_s", "confidence", "decision")
    list_filter = ("decision", "tier")


class JobTransitionInline(admin.TabularInline):
    model = JobTransition
    extra = 0
    readonly_fields = ("from_state", "to_state", "at", "detail")


@admin.register(ReplicationJob)
class ReplicationJobAdmin(admin.ModelAdmin):
    list_display = ("id", "action", "transport", "source", "target", "state", "attempt", "created_at")
    list_filter = ("state", "action", "transport")
    inlines = [JobTransitionInline]
    readonly_fields = ("state",)  # state changes only through services.transition


@admin.register(SpeculativeReplica)
class SpeculativeReplicaAdmin(admin.ModelAdmin):
    list_display = ("id", "engine", "tier", "bytes", "shadow", "placed_at", "expires_at", "hits", "evicted_at")
    list_filter = ("shadow", "tier")
