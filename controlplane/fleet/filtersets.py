"""Filters for the fleet's lists: one FilterSet per list, used by the API and the pages."""

from django_filters import rest_framework as filters

from .models import Engine, Gpu, Node


class NodeFilterSet(filters.FilterSet):
    class Meta:
        model = Node
        fields = {"state": ["exact"], "name": ["exact", "icontains"]}


class GpuFilterSet(filters.FilterSet):
    class Meta:
        model = Gpu
        fields = ["node", "lost"]


class EngineFilterSet(filters.FilterSet):
    class Meta:
        model = Engine
        fields = ["node", "kind", "lifecycle", "model"]
