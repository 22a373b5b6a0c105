"""Filters for demand's lists: one FilterSet per list, used by the API and the pages."""

from django_filters import rest_framework as filters

from .models import WorkloadKey


class WorkloadKeyFilterSet(filters.FilterSet):
    class Meta:
        model = WorkloadKey
        fields = ["tenant", "model", "prefix_group"]
