"""Tokens for automation and gateways, enrolment tokens for agents, and who am I."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.choices import Role, TokenKind

from .. import services
from ..filtersets import ApiTokenFilterSet
from ..models import ApiToken, EnrolmentToken
from ..roles import role_of
from . import serializers as s


class ApiTokenViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """User tokens (act as their user) and gateway tokens (request records only). Admin only."""

    queryset = ApiToken.objects.select_related("user").exclude(kind=TokenKind.AGENT)
    serializer_class = s.ApiTokenSerializer
    filterset_class = ApiTokenFilterSet
    read_role = Role.ADMIN
    write_role = Role.ADMIN

    def perform_create(self, serializer):
        v = serializer.validated_data
        user = self.request.user if v["kind"] == TokenKind.USER else None
        token, raw = services.issue_api_token(
            self.request, v["kind"], v["name"], user=user, expires_at=v.get("expires_at")
        )
        serializer.instance = token
        token.token = raw

    @extend_schema(request=None, responses=s.ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        token = services.revoke_api_token(self.get_object(), request)
        return Response(s.ApiTokenSerializer(token).data)


class EnrolmentTokenViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, viewsets.GenericViewSet
):
    """Expiring tokens that agents trade for node tokens: one-time, or ``max_uses`` agents (a
    fleet token). Admin only."""

    queryset = EnrolmentToken.objects.all()
    serializer_class = s.EnrolmentTokenSerializer
    read_role = Role.ADMIN
    write_role = Role.ADMIN

    def perform_create(self, serializer):
        v = serializer.validated_data
        user = self.request.user if self.request.user.is_authenticated else None
        token, raw = services.issue_enrolment_token(
            self.request,
            v.get("ttl_seconds"),
            labels=v.get("labels", {}),
            created_by=user,
            max_uses=v.get("max_uses", 1),
            node_name=v.get("node_name", ""),
        )
        serializer.instance = token
        token.token = raw


class MeView(APIView):
    """The calling user and role (any signed-in user)."""

    @extend_schema(responses=s.MeSerializer)
    def get(self, request):
        return Response({"username": request.user.get_username(), "role": role_of(request.user)})
