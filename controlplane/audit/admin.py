from django.contrib import admin, messages
from django.http import HttpResponseRedirect

from controlplane.core.errors import DomainError

from .models import AuditEvent


class ServiceAdmin(admin.ModelAdmin):
    """A ModelAdmin whose saves and deletes go through the app's service functions, which
    audit themselves. Subclasses override ``save_with`` / ``delete_with``; a DomainError they
    raise is shown as an error message, with nothing saved."""

    def save_with(self, request, obj, form, change):
        super().save_model(request, obj, form, change)

    def delete_with(self, request, obj):
        super().delete_model(request, obj)

    def save_model(self, request, obj, form, change):
        self.save_with(request, obj, form, change)

    def delete_model(self, request, obj):
        self.delete_with(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_with(request, obj)

    def _refusing(self, view, request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except DomainError as exc:  # the admin's transaction rolled back: nothing changed
            self.message_user(request, exc.detail, level=messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def changeform_view(self, request, *args, **kwargs):
        return self._refusing(super().changeform_view, request, *args, **kwargs)

    def delete_view(self, request, *args, **kwargs):
        return self._refusing(super().delete_view, request, *args, **kwargs)

    def changelist_view(self, request, *args, **kwargs):
        return self._refusing(super().changelist_view, request, *args, **kwargs)


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("at", "actor_label", "action", "object_type", "object_id")
    list_filter = ("action", "object_type")
    search_fields = ("actor_label", "object_id", "reason")
    readonly_fields = [f.name for f in AuditEvent._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
