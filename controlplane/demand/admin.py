from django.contrib import admin

from .models import DemandBucket, WorkloadKey


@admin.register(WorkloadKey)
class WorkloadKeyAdmin(admin.ModelAdmin):
    list_display = ("tenant", "model", "prefix_group", "prefix_tokens", "last_seen")
    search_fields = ("tenant", "model", "prefix_group")


@admin.register(DemandBucket)
class DemandBucketAdmin(admin.ModelAdmin):
    list_display = ("key", "start", "seconds", "requests", "prompt_tokens")
    list_filter = ("seconds",)
