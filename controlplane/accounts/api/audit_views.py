"""The audit log's read API (the audit app sits below accounts: accounts writes audit events)."""

from rest_framework import viewsets

from controlplane.audit.filtersets import AuditEventFilterSet
from controlplane.audit.models import AuditEvent

from ..choices import Role
from .audit_serializers import AuditEventSerializer


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Who did what, before and after. Operators and admins read it."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilterSet
    read_role = Role.OPERATOR
