from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from wire import protocol

from ..configured_index import get_index
from ..ingestion import ENGINE_FIELDS, GPU_FIELDS
from ..models import Engine, Gpu, GpuSample, Node


class NodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "labels",
            "state",
            "last_seen",
            "last_seq",
            "reports_applied",
            "transports",
            "reenrol_allowed_until",
            "created_at",
        ]
        read_only_fields = [
            "transports",
            "reenrol_allowed_until",
            "last_seen",
            "last_seq",
            "reports_applied",
            "created_at",
            "name",
        ]


class GpuSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "node",
            "node_name",
            "uuid",
            *GPU_FIELDS,
            "claimed_by",
            "claimed_at",
            "updated_at",
        ]
        read_only_fields = fields


class ReassignSerializer(serializers.Serializer):
    node = serializers.PrimaryKeyRelatedField(queryset=Node.objects.all())
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)


class GpuSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuSample
        fields = ["at", "memory_used", "kv_bytes", "speculative_bytes", "utilization_gpu"]


class EngineSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    blocks = serializers.SerializerMethodField()

    class Meta:
        model = Engine
        fields = [
            "id",
            "node",
            "node_name",
            "engine_id",
            *ENGINE_FIELDS,
            "gpus",
            "lifecycle",
            "readiness",
            "residency_synced",
            "last_seen",
            "engine_scoped_at",
            "engine_scoped_blocks",
            "blocks",
        ]
        read_only_fields = [f for f in fields if f != "lifecycle"]

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_blocks(self, engine):
        return get_index().usage(engine.pk).blocks


class LookupSerializer(serializers.Serializer):
    keys = serializers.ListField(
        child=serializers.RegexField(r"^[0-9a-fA-F]{1,16}$"), required=False, max_length=100_000
    )
    token_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=2**32 - 1),
        required=False,
        max_length=2_000_000,
    )
    block_size = serializers.IntegerField(min_value=1, max_value=1 << 20, required=False)
    lora_name = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(min_value=1, max_value=256, default=16)

    def validate(self, data):
        if ("keys" in data) == ("token_ids" in data):
            raise serializers.ValidationError({"keys": "give exactly one of keys or token_ids"})
        if "token_ids" in data and "block_size" not in data:
            raise serializers.ValidationError({"block_size": "required with token_ids"})
        return data


class LookupHolderSerializer(serializers.Serializer):
    engine = serializers.IntegerField()
    engine_name = serializers.CharField()
    node = serializers.CharField()
    depth = serializers.IntegerField()
    tokens = serializers.IntegerField()
    tier = serializers.CharField()


class LookupResponseSerializer(serializers.Serializer):
    keys = serializers.ListField(child=serializers.CharField())
    holders = LookupHolderSerializer(many=True)


class LifecycleSerializer(serializers.Serializer):
    lifecycle = serializers.ChoiceField(choices=protocol.ENGINE_LIFECYCLES)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500)
