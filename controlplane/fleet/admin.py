from django.contrib import admin

from .models import Engine, Gpu, Node


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "last_seen", "last_seq", "reports_applied")
    list_filter = ("state",)
    search_fields = ("name",)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("uuid", "node", "index", "name", "memory_used", "memory_total", "lost")
    list_filter = ("lost",)


@admin.register(Engine)
class EngineAdmin(admin.ModelAdmin):
    list_display = ("__str__", "kind", "model", "lifecycle", "readiness", "last_seen")
    list_filter = ("kind", "lifecycle")
