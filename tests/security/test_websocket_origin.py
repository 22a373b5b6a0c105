"""Websockets: browser sockets are origin-checked (they carry session cookies), agent sockets are
token-authenticated and need no Origin."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import Group
from django.contrib.sessions.backends.db import SessionStore

from controlplane.asgi import application
from tests.api.conftest import make_user

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@database_sync_to_async
def session_cookie() -> bytes:
    Group.objects.get_or_create(
        name="viewer"
    )  # transactional tests flush the data migration's groups
    user = make_user("viewer", "ws-viewer")
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return f"sessionid={store.session_key}".encode()


async def dashboard(origin: bytes | None, cookie: bytes):
    headers = [(b"cookie", cookie)] + ([(b"origin", origin)] if origin else [])
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
    try:
        connected, code = await comm.connect()
    finally:
        await comm.disconnect()
    return connected, code


async def test_signed_in_dashboard_socket_from_an_allowed_origin_connects():
    connected, _ = await dashboard(b"http://localhost", await session_cookie())
    assert connected


@pytest.mark.parametrize("origin", [b"http://evil.example", None])
async def test_a_signed_in_session_from_a_foreign_or_missing_origin_is_refused(origin):
    # Cross-site websocket hijacking: the browser would send the cookie from any page.
    connected, _ = await dashboard(origin, await session_cookie())
    assert not connected


async def test_agent_socket_needs_a_token_not_an_origin():
    comm = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"origin", b"http://evil.example")]
    )
    try:
        connected, code = await comm.connect()
        assert not connected and code == 4401
    finally:
        await comm.disconnect()
