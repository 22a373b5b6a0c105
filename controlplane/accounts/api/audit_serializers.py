from rest_framework import serializers

from controlplane.audit.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "at",
            "actor_label",
            "action",
            "object_type",
            "object_id",
            "before",
            "after",
            "reason",
        ]
        read_only_fields = fields
