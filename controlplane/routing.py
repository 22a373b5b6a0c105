"""Websocket routes (the socket side of ``urls.py``): dashboards (session login) and agents (bearer
token). A route table imports the consumers it routes to, so it sits at the top, beside urls.py,
not in the realtime plumbing below every app."""

from django.urls import path

from controlplane.agentapi.consumer import AgentConsumer
from frontend import consumers

websocket_urlpatterns: list = [
    path("ws/dashboard/", consumers.dashboard_app),
    path("ws/agent/", AgentConsumer.as_asgi()),
]
