"""Secrets, hosts, cookies and headers. Outside the embedded default every secret is required."""

import secrets
from datetime import timedelta

from .base import DATA_DIR, DEBUG, EMBEDDED
from .env import get_from_env, str_to_bool, str_to_list


def _embedded_secret() -> str:
    # A per-install secret kept in the data folder, so sessions survive a restart of the demo.
    path = DATA_DIR / "secret_key"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


if EMBEDDED:
    SECRET_KEY = get_from_env("SECRET_KEY", None) or _embedded_secret()
    ALLOWED_HOSTS = get_from_env(
        "ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"], type_cast=str_to_list
    )
else:
    SECRET_KEY = get_from_env("SECRET_KEY")
    if len(SECRET_KEY) < 50:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("environment variable SECRET_KEY is malformed: use 50+ chars")
    ALLOWED_HOSTS = get_from_env("ALLOWED_HOSTS", type_cast=str_to_list)

CSRF_TRUSTED_ORIGINS = get_from_env("CSRF_TRUSTED_ORIGINS", [], type_cast=str_to_list)

# TLS terminates at the load balancer in production; these follow it.
SECURE = get_from_env("PREWARM_SECURE", not EMBEDDED and not DEBUG, type_cast=str_to_bool)
SESSION_COOKIE_SECURE = SECURE
CSRF_COOKIE_SECURE = SECURE
SECURE_SSL_REDIRECT = SECURE and get_from_env("SECURE_SSL_REDIRECT", True, type_cast=str_to_bool)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = 31536000 if SECURE else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE
SECURE_HSTS_PRELOAD = SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'self'"
)

# Sign-in throttling (django-axes; controlplane/accounts/lockout.py, docs/security.md). Failed
# sign-ins are counted per (user name, address) pair and per address. At
# PREWARM_LOGIN_FAILURE_LIMIT failures the pair is locked for the cool-off: the same user from
# another address, and other users from that address, still sign in, so guessing one account's
# password cannot lock its owner (or an admin) out. At PREWARM_LOGIN_ADDRESS_FAILURE_LIMIT
# failures (any user names) the address itself is locked: a password spray from one address stops
# there. Attempts while locked do not extend the lock (an attacker gets at most the limit's guesses
# per cool-off either way, and the user's wait stays what the page says).
PREWARM_LOGIN_FAILURE_LIMIT = get_from_env("PREWARM_LOGIN_FAILURE_LIMIT", 5, type_cast=int)
PREWARM_LOGIN_ADDRESS_FAILURE_LIMIT = get_from_env(
    "PREWARM_LOGIN_ADDRESS_FAILURE_LIMIT", 20, type_cast=int
)
PREWARM_LOGIN_COOLOFF_SECONDS = get_from_env(
    "PREWARM_LOGIN_COOLOFF_SECONDS", 900.0, type_cast=float
)
# Proxies in front of the web processes that append to X-Forwarded-For (0: use REMOTE_ADDR).
# Behind a load balancer set it, or every client shares the balancer's address and its lockout.
PREWARM_TRUSTED_PROXY_COUNT = get_from_env("PREWARM_TRUSTED_PROXY_COUNT", 0, type_cast=int)
AXES_ENABLED = True
AXES_FAILURE_LIMIT = PREWARM_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=PREWARM_LOGIN_COOLOFF_SECONDS)
# The order matters: AuditingAxesHandler.get_failures reads the pair's attempts first, then the
# address's, each against its own limit (axes itself compares their maximum with one limit).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HANDLER = "controlplane.accounts.lockout.AuditingAxesHandler"
AXES_LOCKOUT_CALLABLE = "controlplane.accounts.lockout.lockout_response"
AXES_CLIENT_IP_CALLABLE = "controlplane.accounts.lockout.client_ip"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False
