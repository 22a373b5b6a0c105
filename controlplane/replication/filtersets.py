"""Filters for replication's lists: one FilterSet per list, used by the API and the pages."""

from django_filters import rest_framework as filters

from .models import Override, Policy, ReplicationJob, ReplicationPlan, SpeculativeReplica


class PolicyFilterSet(filters.FilterSet):
    class Meta:
        model = Policy
        fields = ["active", "mode"]


class OverrideFilterSet(filters.FilterSet):
    class Meta:
        model = Override
        fields = ["kind", "active", "node", "engine"]


class ReplicationPlanFilterSet(filters.FilterSet):
    class Meta:
        model = ReplicationPlan
        fields = ["state", "mode", "policy"]


class ReplicationJobFilterSet(filters.FilterSet):
    class Meta:
        model = ReplicationJob
        fields = ["state", "action", "transport", "source", "target"]


class SpeculativeReplicaFilterSet(filters.FilterSet):
    class Meta:
        model = SpeculativeReplica
        fields = ["engine", "shadow", "tier", "workload_key"]
