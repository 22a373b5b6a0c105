"""Password guessing: failed sign-ins are counted per (user name, address) pair and, with a higher
limit, per address; they lock for a cool-off, land in the audit log, and an admin can unlock; API
tokens are not affected (OWASP API2). Guessing one account's password locks only that pair, so
nobody can lock its owner, or everyone behind the same address, out (issue 25).

Time is driven explicitly: django-axes compares each attempt's stored time with now minus the
cool-off, so moving the stored attempts back by the cool-off is exactly the cool-off passing.
"""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken
from controlplane.audit.models import AuditEvent
from tests.api.conftest import bearer, make_user

RIGHT = "pw-123456789"


def sign_in(client: Client, username: str, password: str, path: str = "/login/", ip="10.0.0.9"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=ip)


def signed_in(resp) -> bool:
    return resp.status_code == 302 and "/login/" not in resp.url


def pass_time(seconds: float) -> None:
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(seconds=seconds))


@pytest.fixture
def cooloff(settings):
    return settings.PREWARM_LOGIN_COOLOFF_SECONDS


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_twenty_wrong_passwords_lock_the_user_until_the_cool_off_passes(db, cooloff, path):
    make_user("admin", "root").__class__.objects.filter(username="root").update(is_staff=True)
    client = Client()
    codes = [sign_in(client, "root", f"guess-{i}", path).status_code for i in range(20)]
    assert codes[:4] == [200] * 4  # the form again, with the usual error
    assert set(codes[4:]) == {429}  # the 5th failure locks
    resp = sign_in(client, "root", RIGHT, path)
    assert resp.status_code == 429 and not signed_in(resp)
    body = resp.content.decode()
    assert "Too many failed sign-ins" in body and "15 minutes" in body
    assert int(resp["Retry-After"]) == int(cooloff)
    # A minute before the cool-off ends it is still locked; the attempt does not extend it.
    pass_time(cooloff - 60)
    assert sign_in(client, "root", RIGHT, path).status_code == 429
    pass_time(61)
    assert signed_in(sign_in(client, "root", RIGHT, path))
    assert not AccessAttempt.objects.filter(username="root").exists()  # success resets the count


def test_a_locked_pair_leaves_other_users_and_other_addresses_signing_in(db):
    make_user("admin", "root")
    make_user("viewer", "alice")
    for i in range(5):
        sign_in(Client(), "root", f"guess-{i}", ip="10.0.0.66")
    assert sign_in(Client(), "root", RIGHT, ip="10.0.0.66").status_code == 429
    # Another user from the same address, and the same user from another address, sign in.
    assert signed_in(sign_in(Client(), "alice", RIGHT, ip="10.0.0.66"))
    assert signed_in(sign_in(Client(), "root", RIGHT, ip="10.0.0.7"))
    # alice's success did not clear root's lock from that address.
    assert sign_in(Client(), "root", RIGHT, ip="10.0.0.66").status_code == 429


def test_failures_count_per_address_too(db, settings):
    limit = settings.PREWARM_LOGIN_ADDRESS_FAILURE_LIMIT
    assert limit > settings.PREWARM_LOGIN_FAILURE_LIMIT
    make_user("viewer", "alice")
    make_user("viewer", "bob")
    client = Client()
    for i in range(limit - 1):  # a spray: one guess for each of many user names
        assert sign_in(client, f"nobody-{i}", "x", ip="10.0.0.66").status_code == 200
    # One short of the address's limit: a user from that address still signs in ...
    assert signed_in(sign_in(Client(), "bob", RIGHT, ip="10.0.0.66"))
    # ... and bob's success does not clear the address's count: one more failure locks it.
    assert sign_in(client, "nobody-last", "x", ip="10.0.0.66").status_code == 429
    assert sign_in(client, "alice", RIGHT, ip="10.0.0.66").status_code == 429
    # alice herself is not locked from elsewhere: only that address is.
    assert signed_in(sign_in(Client(), "alice", RIGHT, ip="10.0.0.7"))


def test_a_burst_and_its_lockout_are_audited(db):
    make_user("viewer", "alice")
    for i in range(7):
        sign_in(Client(), "alice", f"bad-{i}")
    events = list(AuditEvent.objects.filter(action__startswith="login.").order_by("id"))
    assert [e.action for e in events] == ["login.failed", "login.locked_out"]
    failed, locked = events
    alice = User.objects.get(username="alice")
    assert failed.object_id == locked.object_id == str(alice.pk)
    assert locked.after["failures"] == 5 and locked.after["ip_address"] == "10.0.0.9"
    assert (
        locked.actor_label == "anonymous@10.0.0.9" and "locked out for 15 minutes" in locked.reason
    )
    assert "bad-" not in str(locked.after) + locked.reason  # no password in the trail


def test_admin_unlock_action_clears_the_lockout_and_is_audited(db):
    make_user("viewer", "alice")
    for i in range(5):
        sign_in(Client(), "alice", f"bad-{i}")
    assert sign_in(Client(), "alice", RIGHT).status_code == 429
    admin = Client()
    admin.force_login(User.objects.create_superuser("boss", password=RIGHT))
    ids = list(AccessAttempt.objects.values_list("pk", flat=True))
    resp = admin.post(
        "/admin/axes/accessattempt/",
        {"action": "unlock_sign_in", "_selected_action": ids},
        REMOTE_ADDR="10.0.0.1",
    )
    assert resp.status_code == 302
    assert signed_in(sign_in(Client(), "alice", RIGHT))
    event = AuditEvent.objects.get(action="login.unlocked")
    assert event.actor_label == "user:boss" and event.before["username"] == "alice"


def test_api_tokens_work_from_a_locked_address(db):
    user = make_user("viewer", "alice")
    for i in range(6):
        sign_in(Client(), "alice", f"bad-{i}", ip="127.0.0.1")
    assert sign_in(Client(), "alice", RIGHT, ip="127.0.0.1").status_code == 429
    _, raw = ApiToken.issue(TokenKind.USER, "ci", user=user)
    assert bearer(raw).get("/api/nodes/", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_client_address_behind_trusted_proxies(db, settings):
    settings.PREWARM_TRUSTED_PROXY_COUNT = 1
    make_user("viewer", "alice")
    # The client forges a left-most address; the proxy's entry is what counts (and locks).
    for i in range(settings.PREWARM_LOGIN_ADDRESS_FAILURE_LIMIT):
        Client().post(
            "/login/",
            {"username": f"x{i}", "password": "x"},
            REMOTE_ADDR="10.1.1.1",
            HTTP_X_FORWARDED_FOR=f"1.2.3.{i}, 203.0.113.5",
        )
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.5"}
    locked = Client().post(
        "/login/",
        {"username": "alice", "password": RIGHT},
        REMOTE_ADDR="10.1.1.1",
        HTTP_X_FORWARDED_FOR="203.0.113.5",
    )
    assert locked.status_code == 429
    other = Client().post(
        "/login/",
        {"username": "alice", "password": RIGHT},
        REMOTE_ADDR="10.1.1.1",
        HTTP_X_FORWARDED_FOR="203.0.113.6",
    )
    assert signed_in(other)


@pytest.mark.slow
def test_lockout_page_under_daphne(tmp_path):
    """The real ASGI path (axes' async middleware) gives the same page, status and header."""
    import re

    import httpx

    from harness.live import LiveControlPlane

    cp = LiveControlPlane(
        tmp_path,
        env={
            "DATABASE_URL": "",
            "REDIS_URL": "",
            "PREWARM_LOGIN_FAILURE_LIMIT": "3",
            "PREWARM_LOGIN_COOLOFF_SECONDS": "120",
        },
    )
    try:
        cp.manage("migrate", "-v0")
        cp.manage("ensure_user", "vera", "--password", RIGHT, "--role", "viewer")
        cp.start()
        with httpx.Client(base_url=cp.url, timeout=10) as c:

            def attempt(password):
                page = c.get("/login/")
                csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
                return c.post(
                    "/login/",
                    data={"username": "vera", "password": password, "csrfmiddlewaretoken": csrf},
                )

            assert [attempt(f"bad-{i}").status_code for i in range(4)] == [200, 200, 429, 429]
            locked = attempt(RIGHT)
            assert locked.status_code == 429 and locked.headers["Retry-After"] == "120"
            assert "sign-in is locked for 2 minutes" in locked.text
    finally:
        cp.close()


def test_retention_drops_old_sign_in_records(db, cooloff):
    from axes.models import AccessLog
    from django.utils import timezone

    from controlplane.audit.services import prune_audit

    make_user("viewer", "alice")
    sign_in(Client(), "alice", "bad")
    assert signed_in(sign_in(Client(), "alice", RIGHT))  # resets alice's count; logs the sign-in
    sign_in(Client(), "mallory", "bad")
    AccessLog.objects.update(attempt_time=timezone.now() - timedelta(days=400))
    pass_time(cooloff + 1)
    out = prune_audit()
    assert out["sign_ins_deleted"] == 1 and out["sign_in_attempts_deleted"] == 1
    assert not AccessLog.objects.exists() and not AccessAttempt.objects.exists()
