"""Policies, overrides, plans (approve / reject), jobs, replicas."""

from datetime import UTC, timedelta

from django.db import transaction
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
from controlplane.audit.services import record, snapshot

from .. import services
from ..jobstates import IllegalTransition
from ..models import Override, Policy, ReplicationJob, ReplicationPlan, SpeculativeReplica
from ..scoreboard import scoreboard
from . import serializers as s


class PolicyViewSet(viewsets.ModelViewSet):
    """Budgets and approval mode; only admins change them, every change audited."""

    queryset = Policy.objects.all()
    serializer_class = s.PolicySerializer
    filterset_fields = ["active", "mode"]
    write_role = Role.ADMIN

    def perform_create(self, serializer):
        self._save(serializer, "policy.created")

    def perform_update(self, serializer):
        self._save(serializer, "policy.updated")

    def _save(self, serializer, action_name):
        with transaction.atomic():
            if serializer.validated_data.get("active"):
                # One active policy: activating one deactivates the others (audited too).
                for other in Policy.objects.select_for_update().filter(active=True).exclude(pk=getattr(serializer.instance, "pk", None)):
                    before = snapshot(other)
                    other.active = False
                    other.save(update_fields=["active"])
                    record(self.request, "policy.deactivated", other, before=before, after=snapshot(other))
            services.audited_save(serializer, self.request, action_name)

    def perform_destroy(self, instance):
        if instance.plans.exists():
            raise ApiError("in_use", "this policy has plans; deactivate it instead", status_code=409)
        record(self.request, "policy.deleted", instance, before=snapshot(instance))
        instance.delete()


class OverrideViewSet(viewsets.ModelViewSet):
    """Pins, exclusions and freezes: operators set them; they always win over plans."""

    queryset = Override.objects.select_related("created_by")
    serializer_class = s.OverrideSerializer
    filterset_fields = ["kind", "active", "node", "engine"]
    write_role = Role.OPERATOR

    def perform_create(self, serializer):
        serializer.validated_data["created_by"] = self.request.user if self.request.user.is_authenticated else None
        services.audited_save(serializer, self.request, "override.created")

    def perform_update(self, serializer):
        services.audited_save(serializer, self.request, "override.updated")

    def perform_destroy(self, instance):
        with transaction.atomic():
            record(self.request, "override.deleted", instance, before=snapshot(instance))
            instance.delete()


class PlanViewSet(viewsets.ReadOnlyModelViewSet):
    """Replication plans; operators approve or reject them whole or per item."""

    queryset = ReplicationPlan.objects.prefetch_related("items__target__node", "items__source__node")
    serializer_class = s.PlanSerializer
    filterset_fields = ["state", "mode", "policy"]
    action_roles = {"approve": Role.OPERATOR, "reject": Role.OPERATOR}

    def _decide(self, request, approve: bool):
        data = s.DecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        plan = self.get_object()
        plan, refused = services.decide(plan.pk, request, approve, data.validated_data.get("items"),
                                        data.validated_data.get("reason", ""))
        plan = self.get_queryset().get(pk=plan.pk)
        return Response({"plan": s.PlanSerializer(plan).data, "refused": {str(k): v for k, v in refused.items()}})

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
    filterset_fields = ["state", "action", "transport", "source", "target"]
    action_roles = {"cancel": Role.OPERATOR}

    @extend_schema(request=s.DecisionSerializer, responses=s.ReplicationJobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        try:
            job = services.cancel_job(self.get_object(), request, (request.data or {}).get("reason", "") if isinstance(request.data, dict) else "")
        except IllegalTransition as exc:
            raise ApiError("illegal_transition", str(exc), "state", status_code=409) from None
        return Response(s.ReplicationJobSerializer(job).data)


class SpeculativeReplicaViewSet(viewsets.ReadOnlyModelViewSet):
    """Speculative replicas with their scores."""

    queryset = SpeculativeReplica.objects.all()
    serializer_class = s.SpeculativeReplicaSerializer
    filterset_fields = ["engine", "shadow", "tier", "workload_key"]


class ScoreboardView(APIView):
    """Speculative replicas' scores per policy, forecaster and tenant, with a recommendation."""

    @extend_schema(parameters=[OpenApiParameter("since", str), OpenApiParameter("until", str)],
                   responses={200: dict})
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
        raise ApiError("invalid", f"{field} is not an ISO 8601 date-time between 1970 and 9000", field)
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)  # PG: offsets <= 15:59
