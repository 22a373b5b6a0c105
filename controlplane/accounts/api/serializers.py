from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..choices import TokenKind
from ..models import ApiToken, EnrolmentToken


@extend_schema_field(
    {"type": "string", "nullable": True, "description": "shown once, at creation; null afterwards"}
)
class _RawToken(serializers.Field):
    def __init__(self, **kwargs):
        super().__init__(read_only=True, source="*", **kwargs)

    def to_representation(self, obj):
        return getattr(obj, "token", None)


class ApiTokenSerializer(serializers.ModelSerializer):
    token = _RawToken()
    user = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "kind",
            "name",
            "prefix",
            "user",
            "node",
            "created_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "token",
        ]
        read_only_fields = [
            "prefix",
            "user",
            "node",
            "created_at",
            "revoked_at",
            "last_used_at",
            "token",
        ]

    @extend_schema_field({"type": "string", "nullable": True})
    def get_user(self, token) -> str | None:
        return token.user.get_username() if token.user_id else None

    def validate_kind(self, value):
        if value == TokenKind.AGENT:
            raise serializers.ValidationError(
                "agent tokens come from enrolment, not from this endpoint"
            )
        return value


class EnrolmentTokenSerializer(serializers.ModelSerializer):
    token = _RawToken()
    ttl_seconds = serializers.IntegerField(
        write_only=True, min_value=60, max_value=30 * 86400, required=False
    )
    max_uses = serializers.IntegerField(min_value=1, max_value=100_000, required=False, default=1)

    class Meta:
        model = EnrolmentToken
        fields = [
            "id",
            "prefix",
            "labels",
            "created_at",
            "expires_at",
            "used_at",
            "node",
            "max_uses",
            "uses",
            "node_name",
            "token",
            "ttl_seconds",
        ]
        read_only_fields = [
            "prefix",
            "created_at",
            "expires_at",
            "used_at",
            "node",
            "uses",
            "token",
        ]


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(allow_null=True)
