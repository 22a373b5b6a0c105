from django.conf import settings
from rest_framework import serializers

from controlplane.core import history

from ..misses import MISS_COUNTERS
from ..models import DemandBucket, HistoryImport, MissBucket, WorkloadKey
from ..otel import OPERATIONS


class RequestRecordSerializer(serializers.Serializer):
    time = serializers.FloatField(help_text="unix seconds of arrival")
    model = serializers.CharField(max_length=200)
    tenant = serializers.CharField(max_length=200)
    keys = serializers.ListField(
        child=serializers.RegexField(r"^[0-9a-fA-F]{1,16}$"), required=False, max_length=20_000
    )
    token_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=2**32 - 1),
        required=False,
        max_length=1_000_000,
    )
    block_size = serializers.IntegerField(min_value=1, max_value=1 << 20, default=16)
    prompt_tokens = serializers.IntegerField(min_value=0, max_value=10**8, required=False)
    cached_tokens = serializers.IntegerField(
        min_value=0,
        max_value=10**8,
        required=False,
        help_text="prompt tokens served from cache (vLLM's usage.prompt_tokens_details.cached_tokens)",
    )
    predicted_cached_tokens = serializers.IntegerField(
        min_value=0,
        max_value=10**8,
        required=False,
        help_text="the cached tokens the gateway's router expected on the engine it chose "
        "(routed vs delivered, per engine, on the misses page)",
    )
    lora_name = serializers.CharField(required=False, max_length=200)
    engine = serializers.CharField(
        required=False,
        max_length=200,
        help_text="the engine that served it: its id in Prewarm (as the residency lookup names it) "
        "or 'node/engine_id'",
    )
    operation = serializers.ChoiceField(
        choices=OPERATIONS,
        required=False,
        help_text="what the client called: chat (/v1/chat/completions) or text_completion "
        "(/v1/completions), as OpenTelemetry's GenAI conventions name them",
    )
    ttft_s = serializers.FloatField(
        required=False,
        min_value=0.0,
        help_text="time to first token the gateway saw, seconds "
        "(at most PREWARM_RECORD_MAX_TTFT_SECONDS)",
    )

    def validate(self, data):
        if ("keys" in data) == ("token_ids" in data):
            raise serializers.ValidationError({"keys": "give exactly one of keys or token_ids"})
        if not 0 < data["time"] < 10**11:
            raise serializers.ValidationError({"time": "not a plausible unix time"})
        # Plausible or refused: these figures are what replicas are credited with.
        cached = data.get("cached_tokens")
        prompt = data.get("prompt_tokens")
        if prompt is None and "token_ids" in data:
            prompt = len(data["token_ids"])
        if cached is not None and prompt is not None and cached > prompt:
            raise serializers.ValidationError(
                {"cached_tokens": "more cached tokens than the prompt has"}
            )
        most = settings.PREWARM_RECORD_MAX_TTFT_SECONDS
        if data.get("ttft_s") is not None and data["ttft_s"] > most:
            raise serializers.ValidationError({"ttft_s": f"a time to first token over {most:g} s"})
        return data


class RequestBatchSerializer(serializers.Serializer):
    records = RequestRecordSerializer(many=True, allow_empty=False)


class RequestBatchResponseSerializer(serializers.Serializer):
    accepted = serializers.IntegerField()
    buckets_touched = serializers.IntegerField()
    workload_keys_created = serializers.IntegerField()


class WorkloadKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = WorkloadKey
        fields = [
            "id",
            "tenant",
            "model",
            "prefix_group",
            "prefix_keys",
            "prefix_tokens",
            "created_at",
            "last_seen",
        ]
        read_only_fields = fields


class DemandBucketSerializer(serializers.ModelSerializer):
    class Meta:
        model = DemandBucket
        fields = ["start", "seconds", "requests", "prompt_tokens", "cached_tokens"]


class MissBucketSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="key.tenant", read_only=True)
    model = serializers.CharField(source="key.model", read_only=True)
    prefix_group = serializers.CharField(source="key.prefix_group", read_only=True)

    class Meta:
        model = MissBucket
        fields = [
            "id",
            "key",
            "tenant",
            "model",
            "prefix_group",
            "engine",
            "start",
            "seconds",
            *MISS_COUNTERS,
        ]
        read_only_fields = fields


class HistoryImportSerializer(serializers.ModelSerializer):
    already_imported = serializers.SerializerMethodField(
        help_text="true when these bytes were imported before: nothing changed, this is that import"
    )

    class Meta:
        model = HistoryImport
        fields = [
            "id",
            "sha256",
            "source",
            "format",
            "filename",
            "lines",
            "rows",
            "requests",
            "skipped_live",
            "skipped_old",
            "skipped_seen",
            "buckets_created",
            "buckets_updated",
            "workload_keys",
            "workload_keys_created",
            "first_time",
            "last_time",
            "imported_by",
            "created_at",
            "seconds",
            "already_imported",
        ]
        read_only_fields = fields

    def get_already_imported(self, obj) -> bool:
        return bool(self.context.get("already_imported"))


class HistoryImportRequestSerializer(serializers.Serializer):
    file = serializers.FileField(
        required=False,
        allow_empty_file=False,
        help_text="the history file (multipart); or give it as `content`",
    )
    content = serializers.CharField(
        required=False, trim_whitespace=False, help_text="the history as text (JSON bodies)"
    )
    format = serializers.ChoiceField(
        choices=["auto", *history.FORMATS],
        default="auto",
        help_text="auto: from the first line ({ -> jsonl, a vLLM or vllm-router log prefix, "
        "else csv)",
    )
    model = serializers.CharField(
        required=False, default="", max_length=200, help_text="for rows (and logs) that name none"
    )
    tenant = serializers.CharField(
        required=False,
        default="",
        max_length=200,
        help_text="for rows that name none (default: the model name, as the request tap's)",
    )
    block_size = serializers.IntegerField(
        min_value=1, max_value=1 << 20, default=16, help_text="the engine's, for token ids"
    )
    source = serializers.CharField(
        required=False,
        default="",
        max_length=200,
        help_text="where the history comes from: a later import from the same source skips "
        "rows at or before this one's last",
    )
    year = serializers.IntegerField(
        required=False, min_value=1970, max_value=3000, help_text="vLLM logs: their year"
    )
    utc_offset_minutes = serializers.IntegerField(
        default=0, min_value=-14 * 60, max_value=14 * 60, help_text="vLLM logs: their zone"
    )

    def validate(self, data):
        if ("file" in data) == ("content" in data):
            raise serializers.ValidationError({"file": "give exactly one of file or content"})
        return data
