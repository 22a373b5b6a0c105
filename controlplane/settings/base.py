"""Core Django settings shared by every mode."""

from pathlib import Path

from wire import protocol

from .env import get_from_env, str_to_bool

BASE_DIR = Path(__file__).resolve().parent.parent.parent
# Embedded mode keeps its SQLite file, spools and secrets here.
DATA_DIR = Path(get_from_env("PREWARM_DATA_DIR", str(BASE_DIR / "var")))

DATABASE_URL = get_from_env("DATABASE_URL", "")
REDIS_URL = get_from_env("REDIS_URL", "")
# Embedded: SQLite, in-memory channel layer, in-process Celery and residency index.
EMBEDDED = not DATABASE_URL and not REDIS_URL

DEBUG = get_from_env("DEBUG", False, type_cast=str_to_bool)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI from a package: no CDN (offline clusters, our CSP)
    "channels",
    "axes",  # before controlplane.accounts, whose admin replaces axes' AccessAttempt admin
    "controlplane.api",
    "controlplane.accounts",
    "controlplane.audit",
    "controlplane.fleet",
    "controlplane.demand",
    "controlplane.forecasting",
    "controlplane.replication",
    "controlplane.realtime",
    "controlplane.agentapi",
    "controlplane.readmodels",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "controlplane.middleware.SecurityHeadersMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into the lockout page (429).
    "axes.middleware.AxesMiddleware",
]

# django-axes first: it refuses a locked-out user name or address before a password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = get_from_env("STATIC_ROOT", str(DATA_DIR / "static"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.accounts.permissions.RolePermission"],
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.api.parsers.JSONParser",  # recursion and overflow: 400, not 500
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api.exceptions.exception_handler",
    # Per token (scopes named after the token kinds: agents, gateways) or user (DRF's own scope);
    # a load test raises them from the environment.
    "DEFAULT_THROTTLE_RATES": {
        protocol.TOKEN_AGENT: get_from_env("PREWARM_THROTTLE_AGENT", "6000/min"),
        protocol.TOKEN_GATEWAY: get_from_env("PREWARM_THROTTLE_GATEWAY", "6000/min"),
        "user": "3000/min",
    },
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Prewarm API",
    "DESCRIPTION": "Predictive speculative KV-cache replication: agents, gateways, operators.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "controlplane.replication.choices.JobState.CHOICES",
        "TransportEnum": "controlplane.replication.choices.Transport.CHOICES",
        "NodeStateEnum": "controlplane.fleet.choices.NodeState.CHOICES",
        "PlanStateEnum": "controlplane.replication.choices.PlanState.CHOICES",
        "TierEnum": "controlplane.replication.choices.StorageTier.CHOICES",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": get_from_env("LOG_LEVEL", "INFO")},
    "loggers": {"cmdstanpy": {"level": "WARNING"}, "daphne": {"level": "WARNING"}},
}
