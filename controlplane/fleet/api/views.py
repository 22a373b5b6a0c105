"""Agent endpoints (enrol, report, heartbeat), the fleet's read API and the residency lookup."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.choices import Role, TokenKind
from controlplane.api.exceptions import ApiError
from controlplane.api.limits import check_body_size
from wire import blockhash

from .. import services
from ..configured_index import get_index
from ..filtersets import EngineFilterSet, GpuFilterSet, NodeFilterSet
from ..models import Engine, Gpu, Node
from . import serializers as s


class NodeViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """GPU nodes; admins may relabel them, retire them (``{"state": "retired"}``: its tokens are
    revoked, its sockets closed) or allow one to re-enrol without its agent's state."""

    queryset = Node.objects.all()
    serializer_class = s.NodeSerializer
    filterset_class = NodeFilterSet
    http_method_names = ["get", "patch", "post", "head", "options"]
    write_role = Role.ADMIN

    def perform_update(self, serializer):
        node = serializer.instance
        for field, value in serializer.validated_data.items():
            setattr(node, field, value)
        services.update_node(node, self.request, list(serializer.validated_data))

    @extend_schema(request=None, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"], url_path="allow-reenrolment")
    def allow_reenrolment(self, request, pk=None):
        """For the next hour any usable enrolment token may re-enrol this node once (a host
        rebuilt without its agent's state); audited."""
        node = services.allow_reenrolment(self.get_object(), request)
        return Response(s.NodeSerializer(node).data)


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """GPUs as their agents last reported them; ``claimed_by`` names a node that reported a GPU
    another owns (refused), and admins may reassign a GPU to a node."""

    queryset = Gpu.objects.select_related("node")
    serializer_class = s.GpuSerializer
    filterset_class = GpuFilterSet
    action_roles = {"reassign": Role.ADMIN}

    @extend_schema(request=s.ReassignSerializer, responses=s.GpuSerializer)
    @action(detail=True, methods=["post"])
    def reassign(self, request, pk=None):
        data = s.ReassignSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        gpu = services.reassign_gpu(
            self.get_object(),
            data.validated_data["node"],
            request,
            reason=data.validated_data.get("reason", ""),
        )
        return Response(s.GpuSerializer(gpu).data)

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
