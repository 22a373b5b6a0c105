"""Policies, overrides, plans, jobs and the speculative replicas they place."""

import uuid

from django.conf import settings
from django.db import models

from controlplane.core import planner

from .choices import (
    Confirmation,
    ItemDecision,
    JobAction,
    JobState,
    OverrideKind,
    PlanState,
    PolicyMode,
    PolicyStrategy,
    StorageTier,
    Transport,
)


class Policy(models.Model):
    """Budgets, thresholds and the approval mode of replication."""

    name = models.CharField(max_length=100, unique=True)
    active = models.BooleanField(default=False, help_text="the one policy the planner uses")
    mode = models.CharField(max_length=16, choices=PolicyMode.CHOICES, default=PolicyMode.SHADOW)
    strategy = models.CharField(
        max_length=16,
        choices=PolicyStrategy.CHOICES,
        default=PolicyStrategy.PREDICTIVE,
        help_text="what decides copies: forecasts (with the reactive fallback), measured demand "
        "alone, or nothing; approval mode, budgets and overrides apply to each",
    )
    hot_fanout = models.BooleanField(
        default=False, help_text="reactive: also fan hot prefixes out as Mooncake Store does"
    )
    max_spec_vram_fraction = models.FloatField(
        default=0.05, help_text="max share of each GPU's KV capacity for speculative replicas"
    )
    max_bytes_per_interval = models.BigIntegerField(default=200 * 1024**3)
    interval_seconds = models.PositiveIntegerField(default=60)
    min_confidence = models.FloatField(default=0.5)
    replica_ttl_seconds = models.PositiveIntegerField(default=900)
    horizon_seconds = models.PositiveIntegerField(default=600, help_text="how far ahead plans look")
    forecast_every_seconds = models.PositiveIntegerField(default=300)
    plan_every_seconds = models.PositiveIntegerField(default=30)
    default_transport = models.CharField(
        max_length=16, choices=Transport.CHOICES, default=Transport.TCP
    )
    holdout_fraction = models.FloatField(
        null=True,
        blank=True,
        help_text="share of approved speculative items withheld at random as the control arm "
        "(empty: PREWARM_HOLDOUT_FRACTION, 0.15 unless configured)",
    )
    # What speculation is charged (core.planner: the simulator's defaults). Empty limits: none.
    min_benefit_ratio = models.FloatField(
        default=planner.BENEFIT_MARGIN,
        help_text="a speculative item is planned only when its expected TTFT saving is at least "
        "this many times what it takes (copy time, the target engine's queue); >= 1",
    )
    max_queue_seconds = models.FloatField(
        null=True,
        blank=True,
        default=planner.MAX_TARGET_QUEUE_S,
        help_text="no speculative item lands on a serving engine whose queue (its agent's "
        "waiting requests, in seconds of prefill) is longer (empty: no limit)",
    )
    max_cluster_queue_seconds = models.FloatField(
        null=True,
        blank=True,
        default=planner.MAX_CLUSTER_QUEUE_S,
        help_text="while the serving engines queue longer than this on average, plan no "
        "speculative copy or promotion, only warm-ups of joining engines (empty: no limit)",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-active", "name"]
        verbose_name_plural = "policies"
        constraints = [
            models.UniqueConstraint(
                fields=["active"], condition=models.Q(active=True), name="one_active_policy"
            ),
            models.CheckConstraint(
                condition=models.Q(max_spec_vram_fraction__gte=0, max_spec_vram_fraction__lte=0.5),
                name="spec_vram_fraction_range",
            ),
            models.CheckConstraint(
                condition=models.Q(min_confidence__gte=0, min_confidence__lte=1),
                name="min_confidence_range",
            ),
            models.CheckConstraint(
                condition=models.Q(holdout_fraction__isnull=True)
                | models.Q(holdout_fraction__gte=0, holdout_fraction__lte=1),
                name="holdout_fraction_range",
            ),
            models.CheckConstraint(
                condition=models.Q(min_benefit_ratio__gte=1), name="min_benefit_ratio_range"
            ),
            models.CheckConstraint(
                condition=models.Q(max_queue_seconds__isnull=True)
                | models.Q(max_queue_seconds__gte=0),
                name="max_queue_seconds_range",
            ),
            models.CheckConstraint(
                condition=models.Q(max_cluster_queue_seconds__isnull=True)
                | models.Q(max_cluster_queue_seconds__gte=0),
                name="max_cluster_queue_seconds_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def validate_constraints(self, exclude=None):
        # Activating a policy deactivates the others (replication.services.save_policy), so a
        # form that activates one is valid; the constraint still guards the database.
        super().validate_constraints(exclude={*(exclude or ()), "active"})


class Override(models.Model):
    """An operator's rule that always wins over plans: pin, exclude or freeze."""

    kind = models.CharField(max_length=20, choices=OverrideKind.CHOICES)
    prefix_keys = models.JSONField(
        default=list, blank=True, help_text="pin: the prefix chain (hex)"
    )
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.CASCADE)
    engine = models.ForeignKey("fleet.Engine", null=True, blank=True, on_delete=models.CASCADE)
    reason = models.TextField(blank=True)
    active = models.BooleanField(default=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}"


class ReplicationPlan(models.Model):
    """One planning cycle's proposal."""

    policy = models.ForeignKey(Policy, on_delete=models.PROTECT, related_name="plans")
    mode = models.CharField(max_length=16, choices=PolicyMode.CHOICES)
    state = models.CharField(max_length=24, choices=PlanState.CHOICES, default=PlanState.PROPOSED)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    summary = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"plan #{self.pk} ({self.state})"


class PlanItem(models.Model):
    """Copy one prefix to one engine (or tier), with why and what it should buy."""

    plan = models.ForeignKey(ReplicationPlan, on_delete=models.CASCADE, related_name="items")
    workload_key = models.ForeignKey(
        "demand.WorkloadKey", null=True, blank=True, on_delete=models.SET_NULL
    )
    prefix_keys = models.JSONField(help_text="the prefix chain, hex, root first")
    prefix_tokens = models.PositiveIntegerField(default=0)
    source = models.ForeignKey(
        "fleet.Engine", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target = models.ForeignKey("fleet.Engine", on_delete=models.CASCADE, related_name="+")
    tier = models.CharField(max_length=8, choices=StorageTier.CHOICES, default=StorageTier.GPU)
    bytes = models.BigIntegerField()
    expected_ttft_saved_s = models.FloatField()
    cost_s = models.FloatField()
    confidence = models.FloatField()
    reason = models.TextField()
    decision = models.CharField(
        max_length=16, choices=ItemDecision.CHOICES, default=ItemDecision.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    refusal = models.TextField(blank=True, help_text="why an approval was refused")
    holdout_draw = models.ForeignKey(
        "HoldoutDraw",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="items",
        help_text="the holdout assignment it was decided under (the holdout's unit)",
    )

    class Meta:
        ordering = ["plan", "-expected_ttft_saved_s", "id"]

    def __str__(self) -> str:
        return f"item #{self.pk} -> {self.target_id} ({self.decision})"


class ReplicationJob(models.Model):
    """One transfer (or eviction) an agent executes; state changes go through services.transition."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    item = models.ForeignKey(
        PlanItem, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    action = models.CharField(max_length=16, choices=JobAction.CHOICES, default=JobAction.REPLICATE)
    transport = models.CharField(max_length=16, choices=Transport.CHOICES, default=Transport.TCP)
    source = models.ForeignKey(
        "fleet.Engine", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target = models.ForeignKey(
        "fleet.Engine", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    prefix_keys = models.JSONField()
    tier = models.CharField(max_length=8, choices=StorageTier.CHOICES, default=StorageTier.GPU)
    bytes = models.BigIntegerField(default=0)
    bytes_done = models.BigIntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=JobState.CHOICES, default=JobState.PENDING, db_index=True
    )
    attempt = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    error = models.TextField(blank=True)
    checksum = models.CharField(max_length=64, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="last (re)delivery")
    retry_at = models.DateTimeField(
        null=True, blank=True, help_text="a failed attempt's retry time"
    )
    attempt_deadline = models.DateTimeField(
        null=True, blank=True, help_text="the current attempt fails after"
    )
    acks = models.JSONField(
        default=dict, blank=True, help_text="role -> attempt the agent acknowledged"
    )
    results = models.JSONField(default=dict, blank=True, help_text="role -> the agent's job.result")
    held_at_dispatch = models.JSONField(
        default=list, blank=True, help_text="keys of the prefix (hex) the target held at dispatch"
    )
    stored_since = models.JSONField(
        default=list,
        blank=True,
        help_text="keys of the prefix (hex) the target's reports stored after dispatch",
    )
    stored_seqs = models.JSONField(
        default=dict,
        blank=True,
        help_text="key (hex) -> the seq of the target agent's report that stored it",
    )
    target_report_seq = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="the target's agent acknowledged the attempt after spooling this report: "
        "only later reports show what the copy stored",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"job {str(self.id)[:8]} {self.action} {self.state}"


class JobTransition(models.Model):
    """One recorded state change of a job."""

    job = models.ForeignKey(ReplicationJob, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=JobState.CHOICES)
    to_state = models.CharField(max_length=16, choices=JobState.CHOICES)
    at = models.DateTimeField(auto_now_add=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["job", "at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state} -> {self.to_state}"


class SpeculativeReplica(models.Model):
    """A prefix placed (or, in shadow mode, that would have been placed) ahead of demand."""

    item = models.ForeignKey(
        PlanItem, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas"
    )
    job = models.ForeignKey(
        ReplicationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas"
    )
    engine = models.ForeignKey(
        "fleet.Engine", on_delete=models.CASCADE, related_name="speculative_replicas"
    )
    workload_key = models.ForeignKey(
        "demand.WorkloadKey", null=True, blank=True, on_delete=models.SET_NULL
    )
    prefix_keys = models.JSONField()
    tier = models.CharField(max_length=8, choices=StorageTier.CHOICES, default=StorageTier.GPU)
    bytes = models.BigIntegerField()
    shadow = models.BooleanField(default=False)
    held_out = models.BooleanField(
        default=False,
        help_text="the holdout's control arm: approved, withheld at random, never placed",
    )
    tokens = models.PositiveIntegerField(
        default=0, help_text="prefix tokens it covers on its engine (from the chain's start)"
    )
    new_tokens = models.PositiveIntegerField(
        default=0, help_text="of those, the ones its engine did not hold at dispatch"
    )
    forecaster = models.CharField(max_length=40, blank=True)
    placed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    evicted_at = models.DateTimeField(null=True, blank=True)
    confirmed_at = models.DateTimeField(
        null=True, blank=True, help_text="when the engine showed it"
    )
    confirmed_by = models.CharField(max_length=24, choices=Confirmation.CHOICES, blank=True)
    lost_at = models.DateTimeField(
        null=True, blank=True, help_text="when a confirmed copy left the engine"
    )
    bytes_moved = models.BigIntegerField(default=0, help_text="what the executor reported moving")
    served_requests = models.PositiveIntegerField(
        default=0,
        help_text="requests of its key served by its engine during the hold (records naming the engine)",
    )
    served_hits = models.PositiveIntegerField(
        default=0, help_text="of those, requests whose cached tokens covered the prefix"
    )
    hits_measured = models.BooleanField(
        default=False,
        help_text="hits come from served-request records; otherwise they are estimated",
    )
    served_cached_tokens = models.BigIntegerField(
        default=0, help_text="cached tokens of the requests its engine served during the hold"
    )
    served_ttft_s = models.FloatField(default=0.0, help_text="sum of those requests' TTFT")
    served_ttft_n = models.PositiveIntegerField(default=0, help_text="how many sent a TTFT")
    ttft_samples = models.JSONField(
        default=list, blank=True, help_text="the first TTFTs (s) of those requests, for plots"
    )
    miss_ttft_s = models.FloatField(
        default=0.0, help_text="sum of TTFTs of its key's requests that missed its prefix"
    )
    miss_ttft_n = models.PositiveIntegerField(default=0)
    # The holdout's measure: every request of its key (any engine) during its hold. Cache-aware
    # routing sends a prefix's requests to the engines holding it, so a held-out (prefix,
    # engine) pair is never served; the key is, on both arms alike.
    key_requests = models.PositiveIntegerField(
        default=0, help_text="requests of its key served by any engine during its hold"
    )
    key_hits = models.PositiveIntegerField(
        default=0, help_text="of those, requests whose cached tokens covered its prefix"
    )
    key_cached_tokens = models.BigIntegerField(
        default=0, help_text="cached tokens of its key's requests during its hold"
    )
    key_ttft_s = models.FloatField(default=0.0, help_text="sum of those requests' TTFT")
    key_ttft_n = models.PositiveIntegerField(default=0, help_text="how many sent a TTFT")
    key_ttft_samples = models.JSONField(
        default=list, blank=True, help_text="the first TTFTs (s) of its key's requests, for plots"
    )
    hits = models.PositiveIntegerField(default=0)
    saving_basis = models.CharField(
        max_length=16,
        blank=True,
        help_text="measured-ttft (misses' TTFT minus hits') or cost-model: where ttft_saved_s "
        "comes from",
    )
    cost_s = models.FloatField(
        default=0.0, help_text="what placing it took: link time of a copy, prefill of a warm-up"
    )
    cost_basis = models.CharField(max_length=32, blank=True)
    tokens_hit = models.BigIntegerField(default=0)
    ttft_saved_s = models.FloatField(default=0.0)
    vram_byte_seconds = models.FloatField(
        default=0.0, help_text="bytes x seconds held in GPU memory"
    )
    host_byte_seconds = models.FloatField(
        default=0.0, help_text="bytes x seconds held in host memory (CPU tier)"
    )
    scored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-placed_at"]
        indexes = [models.Index(fields=["engine", "evicted_at"])]

    def __str__(self) -> str:
        return f"replica #{self.pk} on {self.engine_id}"

    @property
    def full_tokens(self) -> int:
        return len(self.prefix_keys) * (self.engine.block_size if self.engine_id else 0)

    @property
    def status(self) -> str:
        """shadow | held_out | landed (awaiting the engine) | confirmed | partial |
        unconfirmed | lost."""
        if self.shadow:
            return "shadow"
        if self.held_out:
            return "held_out"
        if self.lost_at:
            return JobState.LOST
        if self.confirmed_at:
            return JobState.PARTIAL if 0 < self.tokens < self.full_tokens else JobState.CONFIRMED
        if self.evicted_at:
            return JobState.UNCONFIRMED
        return JobState.LANDED


class HoldoutDraw(models.Model):
    """One assignment of the randomized holdout, its unit: the arm a prefix joined when an item
    of it was approved while it had no live record, and the permuted block it was drawn in
    (``plans/holdout.py``). The prefix's items stay under it until its records' holds end."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="holdout_draws")
    workload_key = models.ForeignKey(
        "demand.WorkloadKey", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    item = models.ForeignKey(PlanItem, null=True, on_delete=models.SET_NULL, related_name="+")
    held_out = models.BooleanField()
    probability = models.FloatField(help_text="the chance this draw had of holding out")
    block = models.PositiveIntegerField(help_text="which block of the policy's draws")
    block_size = models.PositiveSmallIntegerField()
    block_held = models.PositiveSmallIntegerField(help_text="prefixes a whole block holds out")
    position = models.PositiveSmallIntegerField(help_text="1 for a block's first draw")
    held_so_far = models.PositiveSmallIntegerField(help_text="held out in the block, this included")
    at = models.DateTimeField(auto_now_add=True)
    # The assignment's measure, the same on both arms (intention to treat): every request of its
    # prefix, whatever engine served it, in one window that opens at the draw plus the item's
    # modelled placement time and lasts the policy's replica TTL, whatever became of the copy.
    window_start = models.DateTimeField(null=True)
    window_end = models.DateTimeField(null=True)
    tokens = models.PositiveIntegerField(default=0, help_text="prefix tokens a hit must cover")
    requests = models.PositiveIntegerField(
        default=0, help_text="its prefix's requests in the window"
    )
    hits = models.PositiveIntegerField(default=0, help_text="of those, cached over the prefix")
    cached_tokens = models.BigIntegerField(default=0)
    ttft_s = models.FloatField(default=0.0, help_text="sum of those requests' TTFT")
    ttft_n = models.PositiveIntegerField(default=0, help_text="how many sent a TTFT")
    ttft_samples = models.JSONField(default=list, blank=True, help_text="the first TTFTs (s)")

    class Meta:
        ordering = ["-pk"]

    def __str__(self) -> str:
        arm = "held out" if self.held_out else "treated"
        return f"draw #{self.pk}: key {self.workload_key_id} {arm}"
