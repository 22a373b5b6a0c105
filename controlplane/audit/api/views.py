from rest_framework import viewsets

from controlplane.accounts.choices import Role

from ..filtersets import AuditEventFilterSet
from ..models import AuditEvent
from .serializers import AuditEventSerializer


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Who did what, before and after. Operators and admins read it."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilterSet
    read_role = Role.OPERATOR
