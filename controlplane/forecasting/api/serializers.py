from rest_framework import serializers

from ..models import Forecast


class ForecastSerializer(serializers.ModelSerializer):
    class Meta:
        model = Forecast
        fields = [
            "id",
            "key",
            "generated_at",
            "start",
            "bucket_seconds",
            "horizon",
            "yhat",
            "lower",
            "upper",
            "model",
            "backtest_mase",
            "scores",
            "burst_risk",
            "note",
        ]
        read_only_fields = fields
