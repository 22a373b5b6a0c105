import io
import time

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils.decorators import method_decorator
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.choices import Role, TokenKind
from controlplane.accounts.throttling import TokenScopedRateThrottle
from controlplane.api.exceptions import ApiError
from controlplane.api.limits import check_body_size
from controlplane.api.parsers import JSONParser
from controlplane.api.transactions import OwnTransaction
from controlplane.core.history import Defaults
from controlplane.fleet.choices import served_tenants

from .. import history, ingest_slots, services
from ..filtersets import HistoryImportFilterSet, MissBucketFilterSet, WorkloadKeyFilterSet
from ..models import HistoryImport, MissBucket, WorkloadKey
from . import serializers as s


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class RequestRecordsView(OwnTransaction, APIView):
    """Gateways, and agents' request taps, post request records in bulk; they are rolled into
    demand buckets. An agent's records name only its own node's engines. Not one transaction
    per request: a batch waits for an ingest slot (``ingest_slots``) before any transaction
    opens (SQLite's would hold the write lock while it waited); ``services.ingest_records`` is
    the transaction."""

    token_kinds = {TokenKind.GATEWAY, TokenKind.AGENT}
    token_kinds_only = True
    throttle_classes = [TokenScopedRateThrottle]
    throttle_scope = TokenKind.GATEWAY

    @extend_schema(
        request=s.RequestBatchSerializer,
        responses={200: s.RequestBatchResponseSerializer},
        tags=["gateways"],
    )
    def post(self, request):
        check_body_size(request)
        try:
            with ingest_slots.slot():
                return self._ingest(request)
        except ingest_slots.Busy:
            raise ApiError(
                "ingest_busy",
                "every ingest slot of this process stayed busy; send the batch again",
                status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
                retry_after_s=1,
            ) from None

    def _ingest(self, request):
        records = request.data.get("records") if isinstance(request.data, dict) else None
        if isinstance(records, list) and len(records) > settings.PREWARM_MAX_RECORDS_PER_BATCH:
            raise ApiError(
                "too_many_records",
                f"at most {settings.PREWARM_MAX_RECORDS_PER_BATCH} records per batch",
                "records",
                status_code=413,
            )
        batch = s.RequestBatchSerializer(data=request.data)
        batch.is_valid(raise_exception=True)
        records = batch.validated_data["records"]
        agent = request.auth.kind == TokenKind.AGENT
        if agent:
            _check_agent_records(request.auth.node, records)
        # An unknown serving engine is services.UnknownEngine: a 400 naming records.engine.
        return Response(services.ingest_records(records, from_gateway=not agent))


def _check_agent_records(node, records: list[dict]) -> None:
    """An agent speaks only for its own engines: its records name them, name only the tenants
    the node serves (its ``prewarm/tenants`` label, where an admin set one), and stay within the
    node's records-per-minute budget. Refused whole otherwise; nothing is written."""
    own = f"{node.name}/"
    tenants = served_tenants(node.labels)
    for i, rec in enumerate(records):
        if not str(rec.get("engine") or "").startswith(own):
            raise ApiError(
                "not_own_engine",
                f"an agent's records name its own engines as '{own}engine_id'",
                f"records[{i}].engine",
                status_code=403,
            )
        if tenants is not None and rec["tenant"] not in tenants:
            raise ApiError(
                "tenant_not_served",
                f"node {node.name}'s engines do not serve tenant {rec['tenant']!r}",
                f"records[{i}].tenant",
                status_code=403,
            )
    limit = settings.PREWARM_AGENT_RECORDS_PER_MINUTE
    window = f"prewarm:agent-records:{node.pk}:{int(time.time() // 60)}"
    cache.add(window, 0, 120)
    try:
        used = cache.incr(window, len(records))
    except ValueError:  # expired between add and incr
        cache.set(window, used := len(records), 120)
    if used > limit:
        raise ApiError(
            "records_rate_limited",
            f"at most {limit} request records a minute from one node",
            "records",
            status_code=429,
        )


class WorkloadKeyViewSet(viewsets.ReadOnlyModelViewSet):
    """What is forecast: tenant x model x prefix group."""

    queryset = WorkloadKey.objects.all()
    serializer_class = s.WorkloadKeySerializer
    filterset_class = WorkloadKeyFilterSet

    @extend_schema(responses=s.DemandBucketSerializer(many=True))
    @action(detail=True)
    def demand(self, request, pk=None):
        buckets = self.get_object().buckets.order_by("-start")[:2000]
        return Response(s.DemandBucketSerializer(reversed(list(buckets)), many=True).data)


class MissBucketViewSet(viewsets.ReadOnlyModelViewSet):
    """Served requests per workload key, serving engine and bucket, by the reason decided at
    ingest (``GET /api/misses/`` sums them per tenant and engine)."""

    queryset = MissBucket.objects.select_related("key").order_by("-start", "key_id", "engine_id")
    serializer_class = s.MissBucketSerializer
    filterset_class = MissBucketFilterSet


class HistoryImportViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Past request history loaded into the demand buckets (docs/api.md, "Request history"):
    operators import, everyone reads; each import is audited."""

    queryset = HistoryImport.objects.all()
    serializer_class = s.HistoryImportSerializer
    parser_classes = [MultiPartParser, JSONParser]
    write_role = Role.OPERATOR
    filterset_class = HistoryImportFilterSet

    @extend_schema(
        request={
            "multipart/form-data": s.HistoryImportRequestSerializer,
            "application/json": s.HistoryImportRequestSerializer,
        },
        responses={201: s.HistoryImportSerializer, 200: s.HistoryImportSerializer},
    )
    def create(self, request, *args, **kwargs):
        check_body_size(request, settings.PREWARM_HISTORY_MAX_BYTES)
        form = s.HistoryImportRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        if "file" in data:
            f, name = data["file"], data["file"].name or ""
        else:
            f, name = io.BytesIO(data["content"].encode()), ""
        # A row that cannot be read is history.BadHistory: a 400 naming its line, nothing stored.
        imp, already = history.import_history(
            f,
            fmt=data["format"],
            defaults=Defaults(
                model=data["model"],
                tenant=data["tenant"],
                block_size=data["block_size"],
                year=data.get("year"),
                utc_offset_minutes=data["utc_offset_minutes"],
            ),
            source=data["source"],
            filename=name,
            who=request,
        )
        body = s.HistoryImportSerializer(imp, context={"already_imported": already}).data
        return Response(body, status=status.HTTP_200_OK if already else status.HTTP_201_CREATED)
