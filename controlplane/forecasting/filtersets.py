"""Filters for stored forecasts, used by the API and the pages."""

from django_filters import rest_framework as filters

from .models import Forecast


class ForecastFilterSet(filters.FilterSet):
    class Meta:
        model = Forecast
        fields = ["key", "model"]
