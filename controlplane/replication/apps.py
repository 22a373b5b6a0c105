from django.apps import AppConfig


class ReplicationConfig(AppConfig):
    name = "controlplane.replication"
    label = "replication"
