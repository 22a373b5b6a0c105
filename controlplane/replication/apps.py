from django.apps import AppConfig


class ReplicationConfig(AppConfig):
    name = "controlplane.replication"
    label = "replication"

    def ready(self):
        # Every Django process (web, worker, manage.py) sends tasks through the configured app;
        # it is loaded here because controlplane/__init__.py must not import Django.
        import controlplane.celery  # noqa: F401
        from controlplane.demand.misses import register_copies_in_flight
        from controlplane.demand.signals import records_ingested, requests_served
        from controlplane.fleet.signals import residency_reported

        from .jobs.confirm import on_residency_reported
        from .jobs.inflight import copies_in_flight
        from .plans.react import on_records_ingested
        from .scoring import credit_served

        requests_served.connect(credit_served, dispatch_uid="replication.credit_served")
        residency_reported.connect(
            on_residency_reported, dispatch_uid="replication.on_residency_reported"
        )
        records_ingested.connect(on_records_ingested, dispatch_uid="replication.react")
        register_copies_in_flight(copies_in_flight)  # miss reason ``warming``
