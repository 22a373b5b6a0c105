from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "controlplane.api"
    label = "prewarm_api"

    def ready(self):
        from . import schema  # noqa: F401  (registers the OpenAPI extension)
