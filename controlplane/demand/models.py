"""What is forecast (workload keys) and the demand history they are forecast from."""

from django.db import models


class WorkloadKey(models.Model):
    """A tenant's traffic to one model that shares one prefix group."""

    tenant = models.CharField(max_length=200, db_index=True)
    model = models.CharField(max_length=200)
    prefix_group = models.CharField(
        max_length=64, help_text="hex canonical key of the group's shared leading prefix, or '*'"
    )
    prefix_keys = models.JSONField(
        default=list, blank=True, help_text="the shared chain, root first"
    )
    prefix_tokens = models.PositiveIntegerField(default=0)
    prefix_token_ids = models.JSONField(
        default=list,
        blank=True,
        help_text="the shared prefix's token ids, kept only while a plan uses this key (executors need them)",
    )
    token_ids_wanted_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="a plan uses this key: keep its prefix's token ids until then",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    live_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="time of its first live request record: imported history stops there",
    )

    class Meta:
        ordering = ["tenant", "model", "prefix_group"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "model", "prefix_group"], name="workload_key_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.model}/{self.prefix_group[:8]}"


class DemandBucket(models.Model):
    """Requests of one workload key in one time bucket."""

    key = models.ForeignKey(WorkloadKey, on_delete=models.CASCADE, related_name="buckets")
    start = models.DateTimeField()
    seconds = models.PositiveIntegerField()
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(
        default=0, help_text="tokens a gateway saw served from cache"
    )
    served_records = models.PositiveIntegerField(
        default=0, help_text="records that named their serving engine and cached tokens"
    )
    # Gateways see every engine's requests; an agent's tap only its own engine's. Estimates over
    # all engines (a replica's estimated hits) read these, never agents' records.
    gateway_requests = models.PositiveIntegerField(default=0, help_text="of them, from gateways")
    gateway_served_records = models.PositiveIntegerField(
        default=0, help_text="served records from gateways"
    )

    class Meta:
        ordering = ["key", "start"]
        constraints = [
            models.UniqueConstraint(fields=["key", "start", "seconds"], name="demand_bucket_unique")
        ]
        indexes = [models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"{self.key} {self.start:%Y-%m-%d %H:%M} x{self.requests}"


class MissBucket(models.Model):
    """Served requests of one workload key on one serving engine in one time bucket, by the
    reason decided when each record was ingested (``controlplane/core/misses.py``; one column per
    reason of ``misses.REASONS``). No per-request rows: only these counts are kept."""

    key = models.ForeignKey(WorkloadKey, on_delete=models.CASCADE, related_name="miss_buckets")
    engine = models.ForeignKey(
        "fleet.Engine", on_delete=models.CASCADE, related_name="+", help_text="the serving engine"
    )
    start = models.DateTimeField()
    seconds = models.PositiveIntegerField()
    hit = models.PositiveIntegerField(default=0)
    partial = models.PositiveIntegerField(default=0)
    cold = models.PositiveIntegerField(default=0)
    routed_away = models.PositiveIntegerField(default=0)
    evicted = models.PositiveIntegerField(default=0)
    warming = models.PositiveIntegerField(default=0)
    variant = models.PositiveIntegerField(default=0)
    sol_hits = models.PositiveIntegerField(
        default=0, help_text="hits had each request gone to the engine holding its longest prefix"
    )
    prefix_tokens = models.BigIntegerField(default=0, help_text="sum of the requests' prefixes")
    cached_tokens = models.BigIntegerField(default=0, help_text="delivered: served from cache")
    sol_cached_tokens = models.BigIntegerField(
        default=0, help_text="cached tokens at the speed of light (capped at the prefix)"
    )
    predicted_records = models.PositiveIntegerField(
        default=0, help_text="records that carried the gateway's predicted_cached_tokens"
    )
    predicted_cached_tokens = models.BigIntegerField(default=0)
    predicted_delivered_tokens = models.BigIntegerField(
        default=0, help_text="cached tokens delivered to the records that carried a prediction"
    )

    class Meta:
        ordering = ["key", "engine", "start"]
        constraints = [
            models.UniqueConstraint(
                fields=["key", "engine", "start", "seconds"], name="miss_bucket_unique"
            )
        ]
        indexes = [models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"{self.key} on {self.engine_id} {self.start:%Y-%m-%d %H:%M}"


class HistoryImport(models.Model):
    """One file of past request history loaded into the demand buckets (``import_history``)."""

    sha256 = models.CharField(
        max_length=64, unique=True, help_text="of the file's bytes: the same file imports once"
    )
    source = models.CharField(
        max_length=200,
        blank=True,
        db_index=True,
        help_text="where the history comes from (e.g. an engine's log): a later import from "
        "the same source skips rows at or before this one's last",
    )
    format = models.CharField(max_length=32)
    filename = models.CharField(max_length=255, blank=True)
    lines = models.PositiveIntegerField(default=0, help_text="lines read")
    rows = models.PositiveIntegerField(default=0, help_text="rows counted into buckets")
    requests = models.BigIntegerField(default=0)
    skipped_live = models.BigIntegerField(
        default=0, help_text="requests at or after their workload key's first live record"
    )
    skipped_old = models.BigIntegerField(
        default=0,
        help_text="requests older than PREWARM_DEMAND_DAYS (retention would delete them)",
    )
    skipped_seen = models.BigIntegerField(
        default=0, help_text="requests at or before the source's previous import's last one"
    )
    buckets_created = models.PositiveIntegerField(default=0)
    buckets_updated = models.PositiveIntegerField(default=0)
    workload_keys = models.PositiveIntegerField(default=0)
    workload_keys_created = models.PositiveIntegerField(default=0)
    first_time = models.DateTimeField(null=True, blank=True)
    last_time = models.DateTimeField(null=True, blank=True)
    imported_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    seconds = models.FloatField(default=0.0, help_text="how long the import took")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"history {self.pk}: {self.requests} requests ({self.format})"
