from django.apps import AppConfig


class DemandConfig(AppConfig):
    name = "controlplane.demand"
    label = "demand"
