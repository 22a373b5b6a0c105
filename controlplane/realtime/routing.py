"""Websocket routes: dashboards and agents."""

from django.urls import path

from . import consumers

websocket_urlpatterns: list = [
    path("ws/dashboard/", consumers.dashboard_app),
]
