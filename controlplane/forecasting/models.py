"""Stored forecasts: computed by workers, only read by views."""

from django.db import models


class Forecast(models.Model):
    """A forecast of one workload key's requests per bucket, with its backtest error."""

    key = models.ForeignKey(
        "demand.WorkloadKey", on_delete=models.CASCADE, related_name="forecasts"
    )
    generated_at = models.DateTimeField(auto_now_add=True, db_index=True)
    start = models.DateTimeField(help_text="start of the first forecast bucket")
    bucket_s = models.PositiveIntegerField(db_column="bucket_seconds")
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


class FittedModel(models.Model):
    """A slow model (Prophet) fitted off the tick path: its expected count per fit bucket from
    ``end`` on, and whether it won its key's backtest when fitted. Each forecast tick reads these
    instead of refitting; one row per key and model, replaced by each refit."""

    key = models.ForeignKey(
        "demand.WorkloadKey", on_delete=models.CASCADE, related_name="fitted_models"
    )
    model = models.CharField(max_length=40)
    fitted_at = models.DateTimeField(db_index=True)
    end = models.DateTimeField(help_text="end of the history it was fitted on")
    bucket_s = models.PositiveIntegerField(db_column="bucket_seconds")
    fit_s = models.PositiveIntegerField(
        db_column="fit_seconds", help_text="the fit bucket (an hour for Prophet)"
    )
    values = models.JSONField(default=list, help_text="expected count per fit bucket from end")
    sigma = models.FloatField(default=0.0, help_text="in-sample residual RMS per bucket")
    backtest_mase = models.FloatField(null=True, blank=True)
    chosen = models.BooleanField(help_text="it won the key's backtest against the baselines")
    fit_ms = models.FloatField(default=0.0, help_text="wall time of the refit (backtest + fit)")
    note = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "model"], name="fitted_model_unique")]

    def __str__(self) -> str:
        return f"{self.key} {self.model} fitted {self.fitted_at:%H:%M}"
