from rest_framework import viewsets

from ..filtersets import ForecastFilterSet
from ..models import Forecast
from .serializers import ForecastSerializer


class ForecastViewSet(viewsets.ReadOnlyModelViewSet):
    """Stored forecasts (computed by the forecast workers)."""

    queryset = Forecast.objects.select_related("key")
    serializer_class = ForecastSerializer
    filterset_class = ForecastFilterSet
