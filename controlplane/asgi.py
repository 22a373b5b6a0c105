"""ASGI entry point: HTTP through Django, websockets through Channels (browsers and agents).

Browser sockets are origin-checked (they carry session cookies); the agents' socket
(``/ws/agent/``) is not: agents are not browsers, send no Origin header, and authenticate with
their bearer token in the consumer.
"""

import os

from nodeagent import memtrace

memtrace.start_from_env("web")  # before Django loads: its own growth counts too

from django.core.asgi import get_asgi_application  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from controlplane.routing import websocket_urlpatterns  # noqa: E402
from nodeagent import memtrim  # noqa: E402

AGENT_SOCKET_PREFIX = "/ws/agent/"


def websocket_app(router):
    browsers = AllowedHostsOriginValidator(router)

    async def app(scope, receive, send):
        target = router if scope.get("path", "").startswith(AGENT_SOCKET_PREFIX) else browsers
        return await target(scope, receive, send)

    return app


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": websocket_app(URLRouter(websocket_urlpatterns)),
    }
)

# RSS follows what is in use, not peaks
memtrim.start(
    settings.PREWARM_MALLOC_TRIM_SECONDS,
    mmap_threshold=settings.PREWARM_MALLOC_MMAP_THRESHOLD_BYTES,
)

if settings.EMBEDDED and settings.PREWARM_EMBEDDED_WORKER:
    from controlplane.embedded_worker import start as start_embedded_worker

    start_embedded_worker()
