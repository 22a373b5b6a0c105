from django.contrib import admin

from .models import Forecast


@admin.register(Forecast)
class ForecastAdmin(admin.ModelAdmin):
    list_display = (
        "key",
        "model",
        "generated_at",
        "horizon",
        "bucket_s",
        "backtest_mase",
        "burst_risk",
    )
    list_filter = ("model",)
