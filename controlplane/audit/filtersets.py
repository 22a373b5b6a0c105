"""Filters for the audit trail, used by the API and the audit page."""

from django_filters import rest_framework as filters

from controlplane.api.filters import BoundedIsoDateTimeFilter

from .models import AuditEvent


class AuditEventFilterSet(filters.FilterSet):
    since = BoundedIsoDateTimeFilter(field_name="at", lookup_expr="gte")

    class Meta:
        model = AuditEvent
        fields = ["action", "object_type", "object_id", "actor_label"]
