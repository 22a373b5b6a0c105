"""Database, channel layer, Celery broker and residency index: embedded or from the environment."""

import dj_database_url

from .base import DATA_DIR, DATABASE_URL, REDIS_URL
from .env import get_from_env, str_to_bool

if DATABASE_URL:
    try:
        # Under ASGI every request may run in its own thread, so persistent per-thread
        # connections pile up until PostgreSQL refuses clients (seen in bench/ingest.py): use
        # psycopg's pool instead, bounded per process (Django's documented advice for ASGI).
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    except Exception as exc:  # dj_database_url raises several types for a bad URL
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"environment variable DATABASE_URL is malformed: {exc}"
        ) from None
    # Every API request that changes state is one transaction: nothing half-written.
    DATABASES["default"]["ATOMIC_REQUESTS"] = True
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": get_from_env("PREWARM_DB_POOL_MAX", 16, type_cast=int),
            "timeout": get_from_env("PREWARM_DB_POOL_TIMEOUT_SECONDS", 10.0, type_cast=float),
        }
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            # Django's SQLite with writers queued in-process (controlplane/backends/sqlite/base.py).
            "ENGINE": "controlplane.backends.sqlite",
            "NAME": get_from_env("SQLITE_PATH", str(DATA_DIR / "prewarm.sqlite3")),
            "ATOMIC_REQUESTS": True,
            # IMMEDIATE: concurrent writers wait on the busy timeout instead of failing when a read
            # transaction tries to upgrade to a write (SQLITE_BUSY_SNAPSHOT under WAL).
            # synchronous=NORMAL (WAL): a commit is not fsynced, so a power loss may undo the last
            # commits, a process that dies loses nothing; ~1 ms less per write on this machine.
            "OPTIONS": {
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
            },
        }
    }

if REDIS_URL:
    # Shared by every web process, so rate limits (DRF throttles) hold across the fleet of them.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": get_from_env("CACHE_REDIS_URL", REDIS_URL),
            # One pool per process, not one per request's thread (redis_pool.py).
            "OPTIONS": {"pool_class": "controlplane.backends.redis_pool.SharedConnectionPool"},
        }
    }
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
    # Embedded: the worker and beat are threads of the web process (controlplane.embedded_worker)
    # on kombu's in-memory transport, so they share its channel layer and residency index.
    CELERY_BROKER_URL = "memory://"
    # kombu's in-memory transport sleeps 1 s between empty polls: every dispatch waited 0-1 s
    # (bench/e2e.py: approve -> ack p50 0.7 s vs 0.2 s on Redis). 20 dict polls/s cost nothing.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"polling_interval": 0.05}
    RESIDENCY_INDEX = {"backend": "inprocess"}

# Tests may run tasks inline; nothing else should (it would run forecasts inside web requests).
CELERY_TASK_ALWAYS_EAGER = get_from_env("CELERY_TASK_ALWAYS_EAGER", False, type_cast=str_to_bool)
CELERY_TASK_EAGER_PROPAGATES = CELERY_TASK_ALWAYS_EAGER
# No result backend: no task's result is read back (a chain hands it on in the next message).
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A prefork pool child whose resident memory passed this many MiB after a task is replaced by a
# fresh one (Celery's own bound, in KiB): memory a child's Prophet fits and history reads leave
# with the allocator cannot pile up for weeks. 0: never. The embedded worker (threads) has none.
PREWARM_WORKER_MAX_MEMORY_MB = get_from_env("PREWARM_WORKER_MAX_MEMORY_MB", 1024, type_cast=int)
CELERY_WORKER_MAX_MEMORY_PER_CHILD = PREWARM_WORKER_MAX_MEMORY_MB * 1024 or None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Start the in-process worker and beat in the web process (`make demo` sets it; embedded only).
PREWARM_EMBEDDED_WORKER = get_from_env("PREWARM_EMBEDDED_WORKER", False, type_cast=str_to_bool)

# Fixed cadences of beat, seconds. The policy's forecast/plan cadences are applied by `tick`.
PREWARM_SCHEDULE = {
    "tick": get_from_env("PREWARM_TICK_SECONDS", 2.0, type_cast=float),
    "sweep_jobs": get_from_env("PREWARM_SWEEP_SECONDS", 2.0, type_cast=float),
    "evict_expired": get_from_env("PREWARM_EVICT_SECONDS", 10.0, type_cast=float),
    "score": get_from_env("PREWARM_SCORE_SECONDS", 30.0, type_cast=float),
    "mark_stale": get_from_env("PREWARM_MARK_STALE_SECONDS", 5.0, type_cast=float),
}
CELERY_BEAT_SCHEDULE = {
    "tick": {"task": "controlplane.replication.tasks.tick", "schedule": PREWARM_SCHEDULE["tick"]},
    "sweep-jobs": {
        "task": "controlplane.replication.tasks.sweep_jobs",
        "schedule": PREWARM_SCHEDULE["sweep_jobs"],
    },
    "evict-expired": {
        "task": "controlplane.replication.tasks.evict_expired",
        "schedule": PREWARM_SCHEDULE["evict_expired"],
    },
    "score": {
        "task": "controlplane.replication.tasks.score_replicas",
        "schedule": PREWARM_SCHEDULE["score"],
    },
    "mark-stale": {
        "task": "controlplane.fleet.tasks.mark_stale",
        "schedule": PREWARM_SCHEDULE["mark_stale"],
    },
    # Retention keeps the database bounded (docs/reliability.md): one task per app that owns data.
    **{
        f"retention-{app}": {
            "task": f"controlplane.{app}.tasks.retention",
            "schedule": get_from_env("PREWARM_RETENTION_SECONDS", 3600.0, type_cast=float),
        }
        for app in ("fleet", "demand", "forecasting", "replication", "audit")
    },
}
# A periodic run that has not started within its own period is dropped when a worker reaches it
# (the next run is queued anyway): while the worker is slower than beat, runs no longer pile up
# in the broker (the embedded worker's in-memory queue grew ~30 KiB a minute of unrun tick and
# sweep messages on a loaded machine).
for _entry in CELERY_BEAT_SCHEDULE.values():
    _entry["options"] = {**_entry.get("options", {}), "expires": float(_entry["schedule"])}
