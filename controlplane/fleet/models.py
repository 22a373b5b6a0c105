"""GPU nodes, their GPUs and the inference engines on them."""

from django.db import models

from .choices import EngineKind, EngineLifecycle, NodeState


class Node(models.Model):
    """A GPU host running one Prewarm agent."""

    name = models.CharField(max_length=200, unique=True)
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=NodeState.CHOICES, default=NodeState.ACTIVE)
    boot_id = models.CharField(max_length=64, blank=True)
    last_seq = models.BigIntegerField(default=0)
    last_seen = models.DateTimeField(null=True, blank=True)
    reports_applied = models.BigIntegerField(default=0)
    # Proof of identity for re-enrolment: the SHA-256 of a secret the agent was given at its
    # latest enrolment and keeps in its state (shown once, like a token).
    enrol_secret_digest = models.CharField(max_length=64, blank=True)
    reenrol_allowed_until = models.DateTimeField(
        null=True, blank=True, help_text="an admin allowed any enrolment token to re-enrol it"
    )
    transports = models.JSONField(
        null=True,
        blank=True,
        help_text="the transports its agent runs jobs of, as its last report said (null: "
        "an agent that does not say)",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    """One GPU as NVML last reported it (None where NVML could not say)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=100, unique=True)
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True)
    memory_total = models.BigIntegerField(null=True)
    memory_used = models.BigIntegerField(null=True)
    memory_free = models.BigIntegerField(null=True)
    utilization_gpu = models.FloatField(null=True)
    nvlink_peers = models.JSONField(default=list, blank=True)
    pcie = models.JSONField(default=dict, blank=True)
    processes = models.JSONField(default=list, blank=True)
    errors = models.JSONField(default=dict, blank=True)
    lost = models.BooleanField(default=False)
    # Another node reported this uuid: refused for that GPU only, shown to admins to reassign.
    claimed_by = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="claimed_gpus"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node__name", "index"]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class GpuSample(models.Model):
    """A point of GPU memory history (downsampled by the retention job)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(db_index=True)
    memory_used = models.BigIntegerField(null=True)
    kv_bytes = models.BigIntegerField(null=True)
    speculative_bytes = models.BigIntegerField(null=True)
    utilization_gpu = models.FloatField(null=True)

    class Meta:
        ordering = ["gpu", "at"]
        indexes = [models.Index(fields=["gpu", "at"])]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.at:%H:%M:%S}"


class Engine(models.Model):
    """An inference engine instance (vLLM, SGLang ...) whose KV cache Prewarm tracks."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="engines")
    engine_id = models.CharField(
        max_length=100, help_text="the agent's name for it, unique per node"
    )
    kind = models.CharField(max_length=16, choices=EngineKind.CHOICES, default=EngineKind.VLLM)
    model = models.CharField(max_length=200, blank=True)
    block_size = models.PositiveIntegerField(default=16)
    bytes_per_block = models.BigIntegerField(default=0)
    kv_capacity_blocks = models.BigIntegerField(default=0)
    gpus = models.ManyToManyField(Gpu, blank=True, related_name="engines")
    endpoints = models.JSONField(default=dict, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    doctor = models.JSONField(
        default=dict,
        blank=True,
        help_text="what its agent learnt of the engine for the fleet doctor (settings, event "
        "stream, request tap)",
    )
    lifecycle = models.CharField(
        max_length=16, choices=EngineLifecycle.CHOICES, default=EngineLifecycle.SERVING
    )
    readiness = models.FloatField(
        default=1.0, help_text="share of its forecast prefixes already resident (warming engines)"
    )
    residency_synced = models.BooleanField(
        default=False, help_text="a full snapshot has been applied since the engine (re)appeared"
    )
    last_seen = models.DateTimeField(null=True, blank=True)
    engine_scoped_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when a report last carried engine-scoped keys (blocks stored without token ids: "
        "only meaningful on this engine, so a gateway cannot route to them by prefix)",
    )
    engine_scoped_blocks = models.BigIntegerField(
        default=0, help_text="how many engine-scoped keys that report carried"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node__name", "engine_id"]
        constraints = [
            models.UniqueConstraint(fields=["node", "engine_id"], name="engine_unique_per_node")
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.engine_id}"

    @property
    def kv_capacity_bytes(self) -> int:
        return self.kv_capacity_blocks * self.bytes_per_block
