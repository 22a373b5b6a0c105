"""Policies, overrides, plans (approve / reject), jobs, replicas."""

from datetime import UTC, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.choices import Role
from controlplane.api.exceptions import ApiError
from controlplane.api.filters import in_range

from .. import services
from ..filtersets import (
    OverrideFilterSet,
    PolicyFilterSet,
    ReplicationJobFilterSet,
    ReplicationPlanFilterSet,
    SpeculativeReplicaFilterSet,
)
from ..jobs.delivery import cancel_job
from ..models import Override, Policy, ReplicationJob, ReplicationPlan, SpeculativeReplica
from ..plans.decisions import decide_plan
from ..scoreboard import scoreboard
from . import serializers as s


def _apply(serializer, instance):
    """``instance`` with the serializer's validated fields set (the service saves it)."""
    for field, value in serializer.validated_data.items():
        setattr(instance, field, value)
    serializer.instance = instance
    return instance


class PolicyViewSet(viewsets.ModelViewSet):
    """Budgets and approval mode; only admins change them, every change audited."""

    queryset = Policy.objects.all()
    serializer_class = s.PolicySerializer
    filterset_class = PolicyFilterSet
    write_role = Role.ADMIN

    def perform_create(self, serializer):
        services.save_policy(_apply(serializer, Policy()), self.request)

    def perform_update(self, serializer):
        services.save_policy(_apply(serializer, serializer.instance), self.request)

    def perform_destroy(self, instance):
        services.delete_policy(instance, self.request)


class OverrideViewSet(viewsets.ModelViewSet):
    """Pins, exclusions and freezes: operators set them; they always win over plans."""

    queryset = Override.objects.select_related("created_by")
    serializer_class = s.OverrideSerializer
    filterset_class = OverrideFilterSet
    write_role = Role.OPERATOR

    def perform_create(self, serializer):
        override = _apply(serializer, Override())
        override.created_by = self.request.user if self.request.user.is_authenticated else None
        services.save_override(override, self.request)

    def perform_update(self, serializer):
        services.save_override(_apply(serializer, serializer.instance), self.request)

    def perform_destroy(self, instance):
        services.delete_override(instance, self.request)


class PlanViewSet(viewsets.ReadOnlyModelViewSet):
    """Replication plans; operators approve or reject them whole or per item."""

    queryset = ReplicationPlan.objects.prefetch_related(
        "items__target__node", "items__source__node"
    )
    serializer_class = s.PlanSerializer
    filterset_class = ReplicationPlanFilterSet
    action_roles = {"approve": Role.OPERATOR, "reject": Role.OPERATOR}

    def _decide(self, request, approve: bool):
        data = s.DecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        plan = self.get_object()
        plan, refused = decide_plan(
            plan.pk,
            request,
            approve,
            data.validated_data.get("items"),
            data.validated_data.get("reason", ""),
        )
        plan = self.get_queryset().get(pk=plan.pk)
        return Response(
            {
                "plan": s.PlanSerializer(plan).data,
                "refused": {str(k): v for k, v in refused.items()},
            }
        )

    @extend_schema(request=s.DecisionSerializer, responses=s.DecisionResultSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._decide(request, True)

    @extend_schema(request=s.DecisionSerializer, responses=s.DecisionResultSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._decide(request, False)


class ReplicationJobViewSet(viewsets.ReadOnlyModelViewSet):
    """Replication jobs with their state history; operators may cancel them."""

    queryset = ReplicationJob.objects.prefetch_related("transitions")
    serializer_class = s.ReplicationJobSerializer
    filterset_class = ReplicationJobFilterSet
    action_roles = {"cancel": Role.OPERATOR}

    @extend_schema(request=s.DecisionSerializer, responses=s.ReplicationJobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        reason = (request.data or {}).get("reason", "") if isinstance(request.data, dict) else ""
        job = cancel_job(self.get_object(), request, reason)  # IllegalTransition: 409
        return Response(s.ReplicationJobSerializer(job).data)


class SpeculativeReplicaViewSet(viewsets.ReadOnlyModelViewSet):
    """Speculative replicas with their scores."""

    queryset = SpeculativeReplica.objects.select_related("engine")
    serializer_class = s.SpeculativeReplicaSerializer
    filterset_class = SpeculativeReplicaFilterSet


class ScoreboardView(APIView):
    """Speculative replicas' scores per policy, forecaster and tenant, with a recommendation."""

    @extend_schema(
        parameters=[OpenApiParameter("since", str), OpenApiParameter("until", str)],
        responses={200: dict},
    )
    def get(self, request):
        until = _when(request.query_params.get("until"), "until") or timezone.now()
        since = _when(request.query_params.get("since"), "since") or until - timedelta(days=1)
        if since >= until:
            raise ApiError("invalid", "since must be before until", "since")
        return Response(scoreboard(since, until))


def _when(value, field):
    if not value:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None or not in_range(parsed):
        raise ApiError(
            "invalid", f"{field} is not an ISO 8601 date-time between 1970 and 9000", field
        )
    return (
        parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    )  # PG: offsets <= 15:59
