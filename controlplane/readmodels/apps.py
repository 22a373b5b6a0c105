from django.apps import AppConfig


class ReadModelsConfig(AppConfig):
    """Read models that join apps (cache map, dashboard summary, state metrics): above them all."""

    name = "controlplane.readmodels"
    label = "readmodels"
