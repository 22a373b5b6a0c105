from rest_framework import serializers

from ..models import Forecast
from ..services.storage import FORECAST_VALUES


class ForecastSerializer(serializers.ModelSerializer):
    class Meta:
        model = Forecast
        fields = [
            "id",
            "key",
            "generated_at",
            *FORECAST_VALUES,
        ]
        read_only_fields = fields
