"""The audit log's read API (the audit app sits below accounts: accounts writes audit events)."""

from django_filters import rest_framework as filters
from rest_framework import viewsets

from controlplane.api.filters import BoundedIsoDateTimeFilter
from controlplane.audit.models import AuditEvent

from ..choices import Role
from .audit_serializers import AuditEventSerializer


class AuditEventFilter(filters.FilterSet):
    since = BoundedIsoDateTimeFilter(field_name="at", lookup_expr="gte")

    class Meta:
        model = AuditEvent
        fields = ["action", "object_type", "object_id", "actor_label"]


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Who did what, before and after. Operators and admins read it."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilter
    read_role = Role.OPERATOR
