"""Filters for demand's lists: one FilterSet per list, used by the API and the pages."""

from django_filters import rest_framework as filters

from controlplane.api.filters import BoundedIsoDateTimeFilter

from .models import HistoryImport, MissBucket, WorkloadKey


class WorkloadKeyFilterSet(filters.FilterSet):
    class Meta:
        model = WorkloadKey
        fields = ["tenant", "model", "prefix_group"]


class MissBucketFilterSet(filters.FilterSet):
    """Miss buckets by workload key fields, serving engine and time (bucket start)."""

    tenant = filters.CharFilter(field_name="key__tenant")
    model = filters.CharFilter(field_name="key__model")
    prefix_group = filters.CharFilter(field_name="key__prefix_group")
    since = BoundedIsoDateTimeFilter(field_name="start", lookup_expr="gte")
    until = BoundedIsoDateTimeFilter(field_name="start", lookup_expr="lt")

    class Meta:
        model = MissBucket
        fields = ["tenant", "model", "prefix_group", "engine", "key", "since", "until"]


class HistoryImportFilterSet(filters.FilterSet):
    class Meta:
        model = HistoryImport
        fields = ["source", "format", "sha256"]
