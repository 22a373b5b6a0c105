from django.contrib import admin

from controlplane.audit.admin import ServiceAdmin

from . import services
from .models import Engine, Gpu, Node


@admin.register(Node)
class NodeAdmin(ServiceAdmin):
    list_display = ("name", "state", "last_seen", "last_seq", "reports_applied")
    list_filter = ("state",)
    search_fields = ("name",)
    fields = ("name", "labels", "state", "last_seen", "last_seq", "reports_applied")
    readonly_fields = ("name", "last_seen", "last_seq", "reports_applied")  # the agent's

    def has_add_permission(self, request):
        return False  # nodes enrol

    def save_with(self, request, obj, form, change):
        services.update_node(obj, request, list(form.changed_data), reason="admin")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("uuid", "node", "index", "name", "memory_used", "memory_total", "lost")
    list_filter = ("lost",)


@admin.register(Engine)
class EngineAdmin(ServiceAdmin):
    list_display = ("__str__", "kind", "model", "lifecycle", "readiness", "last_seen")
    list_filter = ("kind", "lifecycle")
    fields = ("node", "engine_id", "kind", "model", "lifecycle", "readiness", "last_seen")
    readonly_fields = ("node", "engine_id", "kind", "model", "readiness", "last_seen")  # reported

    def has_add_permission(self, request):
        return False  # agent reports create engines

    def save_with(self, request, obj, form, change):
        if "lifecycle" in form.changed_data:
            services.change_engine_lifecycle(obj, obj.lifecycle, request, reason="admin")
