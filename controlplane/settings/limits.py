"""Operational limits: sizes, staleness, schedules. All overridable from the environment."""

from .env import get_from_env

# Largest request body accepted (agent reports, request-record batches), bytes.
DATA_UPLOAD_MAX_MEMORY_SIZE = get_from_env("PREWARM_MAX_BODY_BYTES", 8 * 1024 * 1024, type_cast=int)
PREWARM_MAX_DELTAS_PER_REPORT = get_from_env("PREWARM_MAX_DELTAS_PER_REPORT", 200_000, type_cast=int)
PREWARM_MAX_RECORDS_PER_BATCH = get_from_env("PREWARM_MAX_RECORDS_PER_BATCH", 20_000, type_cast=int)
# A node that has not reported for this long is stale: it leaves plans and its jobs expire.
PREWARM_NODE_STALE_SECONDS = get_from_env("PREWARM_NODE_STALE_SECONDS", 30.0, type_cast=float)
PREWARM_ENROLMENT_TOKEN_TTL_SECONDS = get_from_env(
    "PREWARM_ENROLMENT_TOKEN_TTL_SECONDS", 24 * 3600, type_cast=int
)
# Demand is rolled up into buckets of this many seconds.
PREWARM_DEMAND_BUCKET_SECONDS = get_from_env("PREWARM_DEMAND_BUCKET_SECONDS", 60, type_cast=int)
# A dashboard socket sends at most one merged update per this many seconds.
PREWARM_DASHBOARD_COALESCE_SECONDS = get_from_env("PREWARM_DASHBOARD_COALESCE_SECONDS", 0.1, type_cast=float)
