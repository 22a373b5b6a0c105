from django.apps import AppConfig


class ForecastingConfig(AppConfig):
    name = "controlplane.forecasting"
    label = "forecasting"
