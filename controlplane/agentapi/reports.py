"""The agents' own endpoints besides their jobs: enrolment, reports, heartbeats and token
rotation (``AgentView`` is the base of every agent-token endpoint, the jobs' too)."""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.decorators import method_decorator
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import metrics
from controlplane.accounts.authentication import AgentTokenAuthentication
from controlplane.accounts.choices import TokenKind
from controlplane.accounts.throttling import TokenScopedRateThrottle
from controlplane.api.exceptions import ApiError
from controlplane.api.limits import check_body_size
from controlplane.api.parsers import JSONParser, MsgpackParser
from controlplane.api.transactions import OwnTransaction
from controlplane.core.agent_report import ReportError, parse_report
from controlplane.core.errors import DomainError
from controlplane.fleet import services
from controlplane.fleet.ingestion import apply_report
from controlplane.fleet.models import Node

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


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class EnrolView(OwnTransaction, APIView):
    """Trade an enrolment token for this node's agent token (the service is the transaction, so
    a refused re-enrolment's audit record is kept)."""

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
        v = data.validated_data
        node, raw, secret = services.enrol(
            v["enrolment_token"],
            v["hostname"],
            v["labels"],
            node_secret=v["node_secret"],
            agent_token=v["agent_token"],
            ip=request.META.get("REMOTE_ADDR", ""),
        )
        return Response(
            {
                "node_id": node.pk,
                "agent_token": raw,
                "node_secret": secret,
                "report_interval_s": 1.0,
            },
            status=status.HTTP_201_CREATED,
        )


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ReportView(OwnTransaction, AgentView):
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
        body = apply_report(self.node(request), report)
        metrics.report_applied(
            time.perf_counter() - t0, sum(len(r.stored) + len(r.removed) for r in report.residency)
        )
        return Response(body)

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
        return Response({"server_time": timezone.now().timestamp()})


class RotateTokenView(AgentView):
    """Trade this agent token for a new one; the old one stops working at once."""

    @extend_schema(request=None, responses={201: s.RotateTokenResponseSerializer}, tags=["agents"])
    def post(self, request):
        raw = services.rotate_agent_token(self.node(request), request.auth, request)
        return Response({"agent_token": raw}, status=status.HTTP_201_CREATED)
