"""Filters for the token lists, used by the API."""

from django_filters import rest_framework as filters

from .models import ApiToken


class ApiTokenFilterSet(filters.FilterSet):
    class Meta:
        model = ApiToken
        fields = ["kind"]
