"""Agent endpoints (enrol, report, heartbeat), the fleet's read API and the residency lookup."""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connections, transaction
from django.utils.decorators import method_decorator
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import metrics
from controlplane.accounts.authentication import AgentTokenAuthentication
from controlplane.accounts.choices import Role, TokenKind
from controlplane.accounts.throttling import TokenScopedRateThrottle
from controlplane.api.exceptions import ApiError
from controlplane.api.limits import check_body_size
from controlplane.api.parsers import MsgpackParser
from controlplane.core import blockhash
from controlplane.core.agent_report import ReportError, parse_report
from controlplane.core.errors import DomainError

from .. import services
from ..filtersets import EngineFilterSet, GpuFilterSet, NodeFilterSet
from ..models import Engine, Gpu, Node
from ..residency import get_index
from . import serializers as s


class AgentView(APIView):
    """Base for endpoints only an agent token may call, each for its own node."""

    # One way to authenticate an agent (accounts.authentication.authenticate_agent); a session
    # still authenticates so a signed-in person is told 403, as on every token-only view.
    authentication_classes = [AgentTokenAuthentication, SessionAuthentication]
    token_kinds = {TokenKind.AGENT}
    token_kinds_only = True
    throttle_classes = [TokenScopedRateThrottle]
    throttle_scope = TokenKind.AGENT
    parser_classes = [JSONParser, MsgpackParser]

    def node(self, request) -> Node:
        return request.auth.node


class EnrolView(APIView):
    """Trade a one-time enrolment token for this node's agent token."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [TokenScopedRateThrottle]
    throttle_scope = TokenKind.AGENT

    @extend_schema(
        request=s.EnrolSerializer, responses={201: s.EnrolResponseSerializer}, tags=["agents"]
    )
    def post(self, request):
        check_body_size(request, 64 * 1024)
        data = s.EnrolSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node, raw = services.enrol(
            data.validated_data["enrolment_token"],
            data.validated_data["hostname"],
            data.validated_data["labels"],
        )
        return Response(
            {"node_id": node.pk, "agent_token": raw, "report_interval_s": 1.0},
            status=status.HTTP_201_CREATED,
        )


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ReportView(AgentView):
    """GPU stats, engines and residency deltas or snapshots, applied atomically.

    Not one transaction per request (``ATOMIC_REQUESTS``): the body is decoded and validated
    before any transaction starts (``apply_report`` is the transaction), so a 5,000-delta report's
    parsing keeps no transaction open (nor, on the embedded SQLite, its one write lock).
    """

    @extend_schema(
        request=s.ReportDocSerializer, responses={200: s.ReportResponseSerializer}, tags=["agents"]
    )
    def post(self, request):
        t0 = time.perf_counter()
        check_body_size(request)
        try:
            report = parse_report(request.data, settings.PREWARM_MAX_DELTAS_PER_REPORT)
        except ReportError as exc:
            raise ApiError("invalid_report", exc.detail, exc.field) from None
        except ValueError as exc:  # e.g. keys outside 64 bits
            raise ApiError("invalid_report", str(exc)) from None
        body = services.apply_report(self.node(request), report)
        metrics.report_applied(
            time.perf_counter() - t0, sum(len(r.stored) + len(r.removed) for r in report.residency)
        )
        return Response(body)

    def get_exception_handler(self):
        handler = super().get_exception_handler()

        def refuse(exc, context):
            # The refusal rolled its own transaction back (apply_report's); the API's handler
            # marks the innermost open transaction for rollback, which here is never this
            # request's, but may be an enclosing one (a test's): leave those as they were.
            marks = {c.alias: c.get_rollback() for c in connections.all() if c.in_atomic_block}
            response = handler(exc, context)
            for alias, mark in marks.items():
                connections[alias].set_rollback(mark)
            return response

        return refuse

    def handle_exception(self, exc):
        # Every refusal, whatever raised it (auth, throttle, size, validation, stale seq).
        metrics.report_rejected(
            getattr(exc, "error_code", None)  # the API layer's ApiError
            or (exc.code if isinstance(exc, DomainError) else "")  # a service's refusal
            or getattr(exc, "default_code", "")
            or type(exc).__name__
        )
        return super().handle_exception(exc)


class HeartbeatView(AgentView):
    """Keep the node from going stale between reports."""

    @extend_schema(request=s.HeartbeatSerializer, responses={200: dict}, tags=["agents"])
    def post(self, request):
        check_body_size(request, 64 * 1024)
        s.HeartbeatSerializer(data=request.data).is_valid(raise_exception=True)
        services.heartbeat(self.node(request))
        from django.utils import timezone

        return Response({"server_time": timezone.now().timestamp()})


class RotateTokenView(AgentView):
    """Trade this agent token for a new one; the old one stops working at once."""

    @extend_schema(request=None, responses={201: s.RotateTokenResponseSerializer}, tags=["agents"])
    def post(self, request):
        raw = services.rotate_agent_token(self.node(request), request.auth, request)
        return Response({"agent_token": raw}, status=status.HTTP_201_CREATED)


class NodeViewSet(viewsets.ModelViewSet):
    """GPU nodes; admins may relabel or retire them."""

    queryset = Node.objects.all()
    serializer_class = s.NodeSerializer
    filterset_class = NodeFilterSet
    http_method_names = ["get", "patch", "head", "options"]
    write_role = Role.ADMIN

    def perform_update(self, serializer):
        node = serializer.instance
        for field, value in serializer.validated_data.items():
            setattr(node, field, value)
        services.update_node(node, self.request, list(serializer.validated_data))


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """GPUs as their agents last reported them."""

    queryset = Gpu.objects.select_related("node")
    serializer_class = s.GpuSerializer
    filterset_class = GpuFilterSet

    @extend_schema(responses=s.GpuSampleSerializer(many=True))
    @action(detail=True)
    def history(self, request, pk=None):
        samples = self.get_object().samples.order_by("-at")[:1440]
        return Response(s.GpuSampleSerializer(reversed(list(samples)), many=True).data)


class EngineViewSet(viewsets.ReadOnlyModelViewSet):
    """Inference engines (created by agent reports); operators set their lifecycle."""

    queryset = Engine.objects.select_related("node").prefetch_related("gpus")
    serializer_class = s.EngineSerializer
    filterset_class = EngineFilterSet
    action_roles = {"lifecycle": Role.OPERATOR}
    token_kinds = {TokenKind.AGENT}

    def check_permissions(self, request):
        # Agents may only call `lifecycle`, and only for their own node's engines.
        if getattr(request.auth, "kind", None) == TokenKind.AGENT and self.action != "lifecycle":
            self.permission_denied(request, message="agents may only set their engines' lifecycle")
        super().check_permissions(request)

    @extend_schema(request=s.LifecycleSerializer, responses=s.EngineSerializer)
    @action(detail=True, methods=["post"])
    def lifecycle(self, request, pk=None):
        engine = self.get_object()
        if (
            getattr(request.auth, "kind", None) == TokenKind.AGENT
            and engine.node_id != request.auth.node_id
        ):
            raise ApiError(
                "forbidden", "an agent may only change its own node's engines", status_code=403
            )
        data = s.LifecycleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        engine = services.change_engine_lifecycle(
            engine,
            data.validated_data["lifecycle"],
            request,
            reason=data.validated_data.get("reason", ""),
        )
        return Response(s.EngineSerializer(engine).data)


class ResidencyLookupView(APIView):
    """Engines holding the longest prefix of the given keys or token ids (a router's scorer)."""

    token_kinds = {TokenKind.GATEWAY}
    read_role = Role.VIEWER
    write_role = Role.VIEWER  # a lookup is a read, sent as POST because bodies can be large

    @extend_schema(
        request=s.LookupSerializer, responses=s.LookupResponseSerializer, tags=["residency"]
    )
    def post(self, request):
        check_body_size(request)
        data = s.LookupSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        if "keys" in v:
            keys = [int(k, 16) for k in v["keys"]]
        else:
            keys = blockhash.chain_keys(
                v["token_ids"], v["block_size"], blockhash.extra_for(v.get("lora_name"))
            )
        holders = get_index().holders(keys, v["limit"])
        engines = Engine.objects.select_related("node").in_bulk([h.engine for h in holders])
        out = []
        for h in holders:
            engine = engines.get(h.engine)
            if engine is None:
                continue
            out.append(
                {
                    "engine": engine.pk,
                    "engine_name": engine.engine_id,
                    "node": engine.node.name,
                    "depth": h.depth,
                    "tokens": h.depth * engine.block_size,
                    "tier": h.tier,
                }
            )
        return Response({"keys": [blockhash.to_hex(k) for k in keys], "holders": out})
