from django_filters import rest_framework as filters
from rest_framework import viewsets

from controlplane.accounts.choices import Role
from controlplane.api.filters import BoundedIsoDateTimeFilter

from ..models import AuditEvent
from .serializers import AuditEventSerializer


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
