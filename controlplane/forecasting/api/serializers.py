from rest_framework import serializers

from ..models import Forecast
from ..services.storage import FORECAST_VALUES

# The API keeps the names its clients read; the model says _s (its column is unchanged).
API_NAMES = {"bucket_s": "bucket_seconds"}


class ForecastSerializer(serializers.ModelSerializer):
    class Meta:
        model = Forecast
        fields = ["id", "key", "generated_at", *(API_NAMES.get(f, f) for f in FORECAST_VALUES)]
        read_only_fields = fields
        extra_kwargs = {api: {"source": field} for field, api in API_NAMES.items()}
