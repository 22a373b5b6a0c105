from rest_framework import serializers

from ..choices import TokenKind
from ..models import ApiToken, EnrolmentToken


class ApiTokenSerializer(serializers.ModelSerializer):
    token = serializers.CharField(read_only=True, help_text="shown once, at creation")
    user = serializers.StringRelatedField(read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "kind", "name", "prefix", "user", "node", "created_at", "expires_at", "revoked_at",
                  "last_used_at", "token"]
        read_only_fields = ["prefix", "user", "node", "created_at", "revoked_at", "last_used_at", "token"]

    def validate_kind(self, value):
        if value == TokenKind.AGENT:
            raise serializers.ValidationError("agent tokens come from enrolment, not from this endpoint")
        return value


class EnrolmentTokenSerializer(serializers.ModelSerializer):
    token = serializers.CharField(read_only=True, help_text="shown once, at creation")
    ttl_seconds = serializers.IntegerField(write_only=True, min_value=60, max_value=30 * 86400, required=False)

    class Meta:
        model = EnrolmentToken
        fields = ["id", "prefix", "labels", "created_at", "expires_at", "used_at", "node", "token", "ttl_seconds"]
        read_only_fields = ["prefix", "created_at", "expires_at", "used_at", "node", "token"]


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(allow_null=True)
