"""Websocket routes: dashboards and agents."""

from django.urls import path

from controlplane.realtime.agent_consumer import AgentConsumer

websocket_urlpatterns: list = []
websocket_urlpatterns.append(path("ws/agent/", AgentConsumer.as_asgi()))
