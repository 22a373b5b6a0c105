"""Database, channel layer, Celery broker and residency index: embedded or from the environment."""

import dj_database_url

from .base import DATA_DIR, DATABASE_URL, EMBEDDED, REDIS_URL
from .env import get_from_env

if DATABASE_URL:
    try:
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    except Exception as exc:  # dj_database_url raises several types for a bad URL
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"environment variable DATABASE_URL is malformed: {exc}"
        ) from None
    # Every API request that changes state is one transaction: nothing half-written.
    DATABASES["default"]["ATOMIC_REQUESTS"] = True
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": get_from_env("SQLITE_PATH", str(DATA_DIR / "prewarm.sqlite3")),
            "ATOMIC_REQUESTS": True,
            # IMMEDIATE: concurrent writers wait on the busy timeout instead of failing when a read
            # transaction tries to upgrade to a write (SQLITE_BUSY_SNAPSHOT under WAL).
            "OPTIONS": {"timeout": 20, "init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"},
        }
    }

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30},
        }
    }
    CELERY_BROKER_URL = get_from_env("CELERY_BROKER_URL", REDIS_URL)
    RESIDENCY_INDEX = {"backend": "redis", "url": get_from_env("RESIDENCY_REDIS_URL", REDIS_URL)}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # The embedded default runs Celery in-process: tasks execute where they are sent.
    CELERY_BROKER_URL = "memory://"
    RESIDENCY_INDEX = {"backend": "inprocess"}

CELERY_TASK_ALWAYS_EAGER = get_from_env("CELERY_TASK_ALWAYS_EAGER", EMBEDDED, type_cast=bool)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
