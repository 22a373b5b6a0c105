"""Stored forecasts: computed by workers, only read by views."""

from django.db import models


class Forecast(models.Model):
    """A forecast of one workload key's requests per bucket, with its backtest error."""

    key = models.ForeignKey(
        "demand.WorkloadKey", on_delete=models.CASCADE, related_name="forecasts"
    )
    generated_at = models.DateTimeField(auto_now_add=True, db_index=True)
    start = models.DateTimeField(help_text="start of the first forecast bucket")
    bucket_seconds = models.PositiveIntegerField()
    horizon = models.PositiveIntegerField(help_text="number of buckets")
    yhat = models.JSONField()
    lower = models.JSONField()
    upper = models.JSONField()
    model = models.CharField(max_length=40)
    backtest_mase = models.FloatField(null=True, blank=True)
    scores = models.JSONField(default=dict, blank=True, help_text="backtest MASE per candidate")
    burst_risk = models.FloatField(null=True, blank=True)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-generated_at", "-id"]
        indexes = [models.Index(fields=["key", "-generated_at"])]

    def __str__(self) -> str:
        return f"{self.key} {self.model} @ {self.generated_at:%H:%M}"
