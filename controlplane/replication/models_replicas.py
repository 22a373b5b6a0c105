"""The speculative replicas plans place and the randomized holdout's draws, with what each
measured. Re-exported by ``models``, where Django finds them."""

from django.db import models

from .choices import Confirmation, JobState, StorageTier


class SpeculativeReplica(models.Model):
    """A prefix placed (or, in shadow mode, that would have been placed) ahead of demand."""

    item = models.ForeignKey(
        "replication.PlanItem",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replicas",
    )
    job = models.ForeignKey(
        "replication.ReplicationJob",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replicas",
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

    policy = models.ForeignKey(
        "replication.Policy", on_delete=models.CASCADE, related_name="holdout_draws"
    )
    workload_key = models.ForeignKey(
        "demand.WorkloadKey", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    item = models.ForeignKey(
        "replication.PlanItem", null=True, on_delete=models.SET_NULL, related_name="+"
    )
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
