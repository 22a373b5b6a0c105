"""Websocket routes: dashboards and agents."""

websocket_urlpatterns: list = []
