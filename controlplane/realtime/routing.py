"""Websocket routes: dashboards (session login) and agents (bearer token)."""

from django.urls import path

from . import consumers
from .agent_consumer import AgentConsumer

websocket_urlpatterns: list = [
    path("ws/dashboard/", consumers.dashboard_app),
    path("ws/agent/", AgentConsumer.as_asgi()),
]
