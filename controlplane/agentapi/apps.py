from django.apps import AppConfig


class AgentApiConfig(AppConfig):
    """The agents' job surface: the jobs websocket, its long-poll fallback and job events."""

    name = "controlplane.agentapi"
    label = "agentapi"
