from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.core.policy import knobs
from wire import blockhash

from ..models import (
    JobTransition,
    Override,
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from ..scoreboard.aggregation import creditable_s


class PolicySerializer(serializers.ModelSerializer):
    class Meta:
        model = Policy
        fields = [
            "id",
            "name",
            "active",
            "mode",
            "strategy",
            "hot_fanout",
            "max_spec_vram_fraction",
            "max_bytes_per_interval",
            "interval_seconds",
            "min_confidence",
            "replica_ttl_seconds",
            "horizon_seconds",
            "forecast_every_seconds",
            "plan_every_seconds",
            "default_transport",
            "holdout_fraction",
            "min_benefit_ratio",
            "max_queue_seconds",
            "max_cluster_queue_seconds",
            "updated_at",
        ]
        read_only_fields = ["updated_at"]
        # Activating a policy deactivates the others (PolicyViewSet._save): no uniqueness check.
        validators: list = []
        # The knobs' ranges come with the model fields' validators (core.policy.knobs); the API
        # keeps the names its clients send (``interval_seconds``), the model says ``_s``.
        extra_kwargs = {
            "active": {"validators": []},
            **{k.api: {"source": k.field} for k in knobs.KNOBS if k.api != k.field},
        }


def _validate_chain(value):
    if not isinstance(value, list) or len(value) > 100_000:
        raise serializers.ValidationError("expected a list of at most 100000 hex keys")
    for i, key in enumerate(value):
        try:
            blockhash.from_hex(key)
        except ValueError:
            raise serializers.ValidationError(f"item {i} is not a 64-bit hex key") from None
    return [k.lower().rjust(16, "0") for k in value]


class OverrideSerializer(serializers.ModelSerializer):
    created_by = serializers.SerializerMethodField()

    @extend_schema_field({"type": "string", "nullable": True})
    def get_created_by(self, override) -> str | None:
        return override.created_by.get_username() if override.created_by_id else None

    class Meta:
        model = Override
        fields = [
            "id",
            "kind",
            "prefix_keys",
            "node",
            "engine",
            "reason",
            "active",
            "expires_at",
            "created_by",
            "created_at",
        ]
        read_only_fields = ["created_by", "created_at"]

    def validate_prefix_keys(self, value):
        return _validate_chain(value)

    def validate(self, data):
        kind = data.get("kind", getattr(self.instance, "kind", None))
        get = lambda f: data.get(f, getattr(self.instance, f, None))  # noqa: E731
        if kind == "pin" and not (get("prefix_keys") and get("engine")):
            raise serializers.ValidationError(
                {"prefix_keys": "a pin needs prefix_keys and an engine"}
            )
        if kind == "exclude_node" and not get("node"):
            raise serializers.ValidationError({"node": "exclude_node needs a node"})
        if kind == "exclude_engine" and not get("engine"):
            raise serializers.ValidationError({"engine": "exclude_engine needs an engine"})
        return data


class PlanItemSerializer(serializers.ModelSerializer):
    target_name = serializers.CharField(source="target.__str__", read_only=True)
    source_name = serializers.SerializerMethodField()
    creditable_ttft_s = serializers.SerializerMethodField(
        help_text="the most the scoreboard can credit this item: one prefill of its prefix on "
        "its target (expected_ttft_saved_s is the planner's model, queue effects included)"
    )
    demand = serializers.SerializerMethodField(
        help_text="the item's prefix's demand by its two parts (requests/s): measured_per_s "
        "(the last minute, or a burst's onset), forecast_per_s (0: no forecast) and "
        "planned_per_s, which is never below the measured part; null on plans made before "
        "the plan summary carried it"
    )

    class Meta:
        model = PlanItem
        fields = [
            "id",
            "plan",
            "workload_key",
            "prefix_keys",
            "prefix_tokens",
            "source",
            "source_name",
            "target",
            "target_name",
            "tier",
            "bytes",
            "expected_ttft_saved_s",
            "creditable_ttft_s",
            "value_terms",
            "demand",
            "cost_s",
            "confidence",
            "reason",
            "decision",
            "decided_by",
            "decided_at",
            "refusal",
        ]
        read_only_fields = fields

    def get_creditable_ttft_s(self, item) -> float:
        return creditable_s(item)

    def get_demand(self, item) -> dict | None:
        return (item.plan.summary or {}).get("demand", {}).get(str(item.workload_key_id))

    def get_source_name(self, item) -> str | None:
        return str(item.source) if item.source_id else None


class PlanSerializer(serializers.ModelSerializer):
    items = PlanItemSerializer(many=True, read_only=True)
    item_count = serializers.IntegerField(source="items.count", read_only=True)

    class Meta:
        model = ReplicationPlan
        fields = [
            "id",
            "policy",
            "mode",
            "state",
            "created_at",
            "decided_at",
            "decided_by",
            "summary",
            "item_count",
            "items",
        ]
        read_only_fields = fields


class DecisionSerializer(serializers.Serializer):
    items = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        help_text="item ids; all pending items when omitted",
        max_length=100_000,
    )
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class DecisionResultSerializer(serializers.Serializer):
    plan = PlanSerializer()
    refused = serializers.DictField(child=serializers.CharField(), help_text="item id -> reason")


class JobTransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobTransition
        fields = ["from_state", "to_state", "at", "detail"]


class ReplicationJobSerializer(serializers.ModelSerializer):
    transitions = JobTransitionSerializer(many=True, read_only=True)

    class Meta:
        model = ReplicationJob
        fields = [
            "id",
            "item",
            "action",
            "transport",
            "source",
            "target",
            "prefix_keys",
            "tier",
            "bytes",
            "bytes_done",
            "state",
            "results",
            "attempt",
            "max_attempts",
            "error",
            "checksum",
            "deadline",
            "created_at",
            "updated_at",
            "transitions",
        ]
        read_only_fields = fields


class SpeculativeReplicaSerializer(serializers.ModelSerializer):
    status = serializers.CharField(
        read_only=True,
        help_text=(
            "shadow | held_out (the holdout's control arm: approved, withheld at random) | landed "
            "(the executor finished, the engine has not shown it yet) | confirmed (the engine's KV "
            "events, an LMCache pin or the coordinator's directory show blocks it lacked at "
            "dispatch, stored after the job started) | partial (part of the prefix: scored on "
            "tokens) | unconfirmed (never shown) | lost (left the engine before its hold ended)"
        ),
    )
    hits_basis = serializers.SerializerMethodField(
        help_text=(
            "measured: hits are requests served by this engine whose cached tokens covered the prefix "
            "(from request records); estimated: records named no serving engine, so hits are the key's "
            "requests during the hold shared among the prefix's holders"
        )
    )

    def get_hits_basis(self, replica) -> str:
        return "measured" if replica.hits_measured else "estimated"

    class Meta:
        model = SpeculativeReplica
        fields = [
            "id",
            "item",
            "job",
            "engine",
            "workload_key",
            "tier",
            "bytes",
            "bytes_moved",
            "shadow",
            "held_out",
            "tokens",
            "new_tokens",
            "forecaster",
            "status",
            "placed_at",
            "confirmed_at",
            "confirmed_by",
            "lost_at",
            "expires_at",
            "evicted_at",
            "hits",
            "hits_basis",
            "served_requests",
            "served_hits",
            "served_cached_tokens",
            "served_ttft_s",
            "served_ttft_n",
            "tokens_hit",
            "ttft_saved_s",
            "saving_basis",
            "cost_s",
            "cost_basis",
            "vram_byte_seconds",
            "host_byte_seconds",
            "scored_at",
        ]
        read_only_fields = fields
