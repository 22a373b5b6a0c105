from django.apps import AppConfig


class ReplicationConfig(AppConfig):
    name = "controlplane.replication"
    label = "replication"

    def ready(self):
        # Every Django process (web, worker, manage.py) sends tasks through the configured app;
        # it is loaded here because controlplane/__init__.py must not import Django.
        import controlplane.celery  # noqa: F401
