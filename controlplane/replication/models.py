"""Policies, overrides, plans, jobs and the speculative replicas they place."""

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.core.policy import knobs

from .choices import (
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


def _knob(knob: knobs.Knob) -> dict:
    """A policy field's default and validators, from its knob (``core.policy.knobs``); a knob
    named otherwise outside the code (``interval_s``: ``interval_seconds``) keeps that name as
    its column and its label."""
    kw: dict = {
        "default": knob.default,
        "validators": [MinValueValidator(knob.low), MaxValueValidator(knob.high)],
    }
    if knob.nullable:
        kw |= {"null": True, "blank": True}
    if knob.api != knob.field:
        kw |= {"db_column": knob.api, "verbose_name": knob.api.replace("_", " ")}
    return kw


def _knob_range(knob: knobs.Knob) -> models.CheckConstraint:
    """The knob's range in the database (empty allowed where it means no limit), named after
    its column."""
    name, low, high = knob.field, knob.low, knob.high
    within = models.Q(**{f"{name}__gte": low, f"{name}__lte": high})
    if knob.nullable:
        within = models.Q(**{f"{name}__isnull": True}) | within
    return models.CheckConstraint(condition=within, name=f"{knob.api}_range")


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
        **_knob(knobs.MAX_SPEC_VRAM_FRACTION),
        help_text="max share of each GPU's KV capacity for speculative replicas",
    )
    max_bytes_per_interval = models.BigIntegerField(**_knob(knobs.MAX_BYTES_PER_INTERVAL))
    interval_s = models.PositiveIntegerField(**_knob(knobs.INTERVAL_S))
    min_confidence = models.FloatField(**_knob(knobs.MIN_CONFIDENCE))
    replica_ttl_s = models.PositiveIntegerField(**_knob(knobs.REPLICA_TTL_S))
    horizon_s = models.PositiveIntegerField(
        **_knob(knobs.HORIZON_S), help_text="how far ahead plans look"
    )
    forecast_every_s = models.PositiveIntegerField(**_knob(knobs.FORECAST_EVERY_S))
    plan_every_s = models.PositiveIntegerField(**_knob(knobs.PLAN_EVERY_S))
    default_transport = models.CharField(
        max_length=16, choices=Transport.CHOICES, default=Transport.TCP
    )
    holdout_fraction = models.FloatField(
        **_knob(knobs.HOLDOUT_FRACTION),
        help_text="share of approved speculative items withheld at random as the control arm "
        "(empty: PREWARM_HOLDOUT_FRACTION, 0.15 unless configured)",
    )
    # What speculation is charged (core.policy.knobs). Empty limits: none.
    min_benefit_ratio = models.FloatField(
        **_knob(knobs.MIN_BENEFIT_RATIO),
        help_text="a speculative item is planned only when its expected TTFT saving is at least "
        "this many times what it takes (copy time, the target engine's queue); >= 1",
    )
    max_queue_s = models.FloatField(
        **_knob(knobs.MAX_QUEUE_S),
        help_text="no speculative item lands on a serving engine whose queue (its agent's "
        "waiting requests, in seconds of prefill) is longer (empty: no limit)",
    )
    max_cluster_queue_s = models.FloatField(
        **_knob(knobs.MAX_CLUSTER_QUEUE_S),
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
            *(_knob_range(k) for k in knobs.KNOBS),
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
    value_terms = models.JSONField(
        default=dict,
        blank=True,
        help_text="the value model's terms, uncorrected (core.policy.value): what its outcome "
        "is measured against",
    )
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


# Defined beside these, re-exported here: the app registry and importers find them here.
from .models_replicas import HoldoutDraw, SpeculativeReplica  # noqa: E402

__all__ = [
    "HoldoutDraw",
    "JobTransition",
    "Override",
    "PlanItem",
    "Policy",
    "ReplicationJob",
    "ReplicationPlan",
    "SpeculativeReplica",
]
