"""Operational limits: sizes, staleness, schedules. All overridable from the environment."""

import os

from nodeagent import memtrim

from .env import get_from_env, str_to_bool

# Largest request body accepted (agent reports, request-record batches), bytes.
DATA_UPLOAD_MAX_MEMORY_SIZE = get_from_env("PREWARM_MAX_BODY_BYTES", 8 * 1024 * 1024, type_cast=int)
PREWARM_MAX_DELTAS_PER_REPORT = get_from_env(
    "PREWARM_MAX_DELTAS_PER_REPORT", 200_000, type_cast=int
)
PREWARM_MAX_RECORDS_PER_BATCH = get_from_env("PREWARM_MAX_RECORDS_PER_BATCH", 20_000, type_cast=int)
# Request-record batches one web process parses at once, and how long a batch waits for a slot
# before it is answered 503 with Retry-After (controlplane/demand/ingest_slots.py).
PREWARM_INGEST_CONCURRENCY = get_from_env("PREWARM_INGEST_CONCURRENCY", 2, type_cast=int)
PREWARM_INGEST_WAIT_SECONDS = get_from_env("PREWARM_INGEST_WAIT_SECONDS", 5.0, type_cast=float)
# Request records an agent's taps may post per minute, per node (a batch that would pass it is
# refused whole, 429): one node cannot flood demand or the scores.
PREWARM_AGENT_RECORDS_PER_MINUTE = get_from_env(
    "PREWARM_AGENT_RECORDS_PER_MINUTE", 30_000, type_cast=int
)
# A record's time to first token above this is not plausible (400).
PREWARM_RECORD_MAX_TTFT_SECONDS = get_from_env(
    "PREWARM_RECORD_MAX_TTFT_SECONDS", 600.0, type_cast=float
)
# Largest history file the API takes (POST /api/history-imports/); `manage.py import_history`
# reads files of any size.
PREWARM_HISTORY_MAX_BYTES = get_from_env(
    "PREWARM_HISTORY_MAX_BYTES", 256 * 1024 * 1024, type_cast=int
)
# A node that has not reported for this long is stale: it leaves plans and its jobs expire.
PREWARM_NODE_STALE_SECONDS = get_from_env("PREWARM_NODE_STALE_SECONDS", 30.0, type_cast=float)
PREWARM_ENROLMENT_TOKEN_TTL_SECONDS = get_from_env(
    "PREWARM_ENROLMENT_TOKEN_TTL_SECONDS", 24 * 3600, type_cast=int
)
# Demand is rolled up into buckets of this many seconds.
PREWARM_DEMAND_BUCKET_SECONDS = get_from_env("PREWARM_DEMAND_BUCKET_SECONDS", 60, type_cast=int)
# Miss reasons (docs/api.md, "Why a request missed"): decided at ingest unless turned off. The residency
# index keeps each engine's removed blocks this long, at most this many per engine (``evicted``);
# a removal or copy up to the lag after a request's time still counts for it (report delay).
PREWARM_MISS_REASONS = get_from_env("PREWARM_MISS_REASONS", True, type_cast=str_to_bool)
# Served request records as OpenTelemetry GenAI spans over OTLP (controlplane/demand/otel.py;
# the SDK's OTEL_EXPORTER_OTLP_* variables say where). Needs the `otel` extra.
PREWARM_OTEL_EXPORT = get_from_env("PREWARM_OTEL_EXPORT", False, type_cast=str_to_bool)
PREWARM_REMOVALS_KEEP_SECONDS = get_from_env(
    "PREWARM_REMOVALS_KEEP_SECONDS", 900.0, type_cast=float
)
PREWARM_REMOVALS_PER_ENGINE = get_from_env("PREWARM_REMOVALS_PER_ENGINE", 20_000, type_cast=int)
PREWARM_MISS_REPORT_LAG_SECONDS = get_from_env(
    "PREWARM_MISS_REPORT_LAG_SECONDS", 10.0, type_cast=float
)
# Prometheus: per-tenant miss series for this many tenants (most served requests), the rest as
# tenant="other".
PREWARM_METRICS_TOP_TENANTS = get_from_env("PREWARM_METRICS_TOP_TENANTS", 10, type_cast=int)
# Misses speculation could remove: cold misses this many seconds before a burst of their key.
PREWARM_MISS_BURST_LEAD_SECONDS = get_from_env(
    "PREWARM_MISS_BURST_LEAD_SECONDS", 300, type_cast=int
)

# The web process, Celery workers, node agents and the demo's virtual cluster hand the C
# allocator's free memory back to the system this often, seconds (glibc's malloc_trim,
# nodeagent/memtrim.py); 0: never.
PREWARM_MALLOC_TRIM_SECONDS = get_from_env(
    "PREWARM_MALLOC_TRIM_SECONDS", memtrim.DEFAULT_EVERY_S, type_cast=float
)
# ... and map blocks of at least this many bytes on their own, the threshold fixed (glibc
# otherwise raises it to each mapped block freed, and a forecast's arrays then fragment the
# heap); 0: glibc's moving threshold. Read the same way as the agent reads it.
PREWARM_MALLOC_MMAP_THRESHOLD_BYTES = memtrim.mmap_threshold_from_env(os.environ)

# Replication workflow (docs/workflow.md).
# Job delivery: attempts and the backoff between them (base * 2^(attempt-1), capped).
PREWARM_JOB_MAX_ATTEMPTS = get_from_env("PREWARM_JOB_MAX_ATTEMPTS", 3, type_cast=int)
PREWARM_JOB_BACKOFF_SECONDS = get_from_env("PREWARM_JOB_BACKOFF_SECONDS", 2.0, type_cast=float)
PREWARM_JOB_BACKOFF_MAX_SECONDS = get_from_env(
    "PREWARM_JOB_BACKOFF_MAX_SECONDS", 60.0, type_cast=float
)
# A dispatched job not acknowledged within this many seconds is sent again (same attempt).
PREWARM_JOB_REDELIVER_SECONDS = get_from_env("PREWARM_JOB_REDELIVER_SECONDS", 10.0, type_cast=float)
# Seconds an attempt may take once dispatched before it fails (and maybe retries).
PREWARM_JOB_ATTEMPT_SECONDS = get_from_env("PREWARM_JOB_ATTEMPT_SECONDS", 120.0, type_cast=float)
# A landed copy the target engine has not shown (KV events, LMCache pin or directory) within this
# many seconds is marked unconfirmed: it never counts as resident.
PREWARM_REPLICA_CONFIRM_SECONDS = get_from_env(
    "PREWARM_REPLICA_CONFIRM_SECONDS", 30.0, type_cast=float
)
# Share of prefixes whose approved speculative plan items are withheld at random (recorded as
# held out, with what they would have done; drawn per prefix in permuted blocks and kept while it
# has a live record): the scoreboard compares those assignments' requests with the treated ones'.
# A policy's own holdout_fraction wins; 0 turns the holdout off.
PREWARM_HOLDOUT_FRACTION = get_from_env("PREWARM_HOLDOUT_FRACTION", 0.15, type_cast=float)
# Treated and held-out assignments (a prefix's draw, each with TTFT from gateways' records) the
# verdict needs before it uses the holdout's measured uplift instead of per-replica credit.
PREWARM_HOLDOUT_MIN_ASSIGNMENTS = get_from_env("PREWARM_HOLDOUT_MIN_ASSIGNMENTS", 10, type_cast=int)
# LMCache leases (pin_timeout_sec on the controller, 300 by default): the agent pins a live
# replica again this often, so its lease never lapses while the replica is held.
PREWARM_LMCACHE_RENEW_SECONDS = get_from_env("PREWARM_LMCACHE_RENEW_SECONDS", 60.0, type_cast=float)
# Prefix token ids (executors that address KV by tokens need them): kept only for workload keys
# a plan uses, for this long after the last plan that used them; false turns keeping them off.
PREWARM_KEEP_PREFIX_TOKEN_IDS = get_from_env(
    "PREWARM_KEEP_PREFIX_TOKEN_IDS", True, type_cast=str_to_bool
)
PREWARM_PREFIX_TOKEN_IDS_KEEP_SECONDS = get_from_env(
    "PREWARM_PREFIX_TOKEN_IDS_KEEP_SECONDS", 3600.0, type_cast=float
)
# The link speed the planner prices copies with where nothing better is known, bytes/s.
PREWARM_LINK_BYTES_PER_S = get_from_env("PREWARM_LINK_BYTES_PER_S", 12.5e9, type_cast=float)
# The load assumed for an engine whose metrics say nothing (0..1).
PREWARM_DEFAULT_ENGINE_LOAD = get_from_env("PREWARM_DEFAULT_ENGINE_LOAD", 0.5, type_cast=float)
# Plan at ingest: a hot spot (reactive) or a burst's onset (predictive) in the request records
# just ingested is planned at once (replication.plans.react), not at the next plan cycle.
PREWARM_REACT_AT_INGEST = get_from_env("PREWARM_REACT_AT_INGEST", True, type_cast=str_to_bool)
# Requests an engine serves at once where its agent does not report ``slots``: an engine's load is
# its running requests over this plus its queue over the plan horizon (core.policy.inputs).
PREWARM_ENGINE_SLOTS = get_from_env("PREWARM_ENGINE_SLOTS", 1.0, type_cast=float)
# Cost-model presets for engines whose model name matches no known preset.
PREWARM_DEFAULT_MODEL = get_from_env("PREWARM_DEFAULT_MODEL", "llama3-70b")
PREWARM_DEFAULT_GPU = get_from_env("PREWARM_DEFAULT_GPU", "h100")
# A warming engine is expected to take traffic this many seconds after it appears.
PREWARM_WARMING_LEAD_SECONDS = get_from_env("PREWARM_WARMING_LEAD_SECONDS", 120.0, type_cast=float)
# Forecasting: history window, candidate models (empty = all, Prophet included), backtest folds.
PREWARM_FORECAST_HISTORY_DAYS = get_from_env("PREWARM_FORECAST_HISTORY_DAYS", 14.0, type_cast=float)
PREWARM_FORECAST_MODELS = get_from_env(
    "PREWARM_FORECAST_MODELS",
    [],
    type_cast=lambda v: [m.strip() for m in v.split(",") if m.strip()],
)
PREWARM_FORECAST_BACKTEST_FOLDS = get_from_env("PREWARM_FORECAST_BACKTEST_FOLDS", 3, type_cast=int)
# The forecast tick's window (days): the baselines' fits, the daily season and the backtest folds
# fit in it; the per-key path and Prophet's refits read PREWARM_FORECAST_HISTORY_DAYS.
PREWARM_FORECAST_TICK_DAYS = get_from_env("PREWARM_FORECAST_TICK_DAYS", 3.0, type_cast=float)
# Prophet refits a forecast worker may spend per hour, off the tick path (forecast-slow queue).
PREWARM_FORECAST_SLOW_FITS_PER_HOUR = get_from_env(
    "PREWARM_FORECAST_SLOW_FITS_PER_HOUR", 600, type_cast=int
)
# A dashboard socket sends at most one merged update per this many seconds.
PREWARM_DASHBOARD_COALESCE_SECONDS = get_from_env(
    "PREWARM_DASHBOARD_COALESCE_SECONDS", 0.1, type_cast=float
)

# Retention (docs/reliability.md): the database stays bounded. The hourly `retention` tasks
# roll fine rows up into hourly ones past the fine horizon and delete rows past the last one.
PREWARM_RETENTION_SECONDS = get_from_env("PREWARM_RETENTION_SECONDS", 3600.0, type_cast=float)
# GPU memory samples: one a minute for this long, then one an hour (averaged), then gone.
PREWARM_GPU_SAMPLE_FINE_HOURS = get_from_env("PREWARM_GPU_SAMPLE_FINE_HOURS", 24.0, type_cast=float)
PREWARM_GPU_SAMPLE_DAYS = get_from_env("PREWARM_GPU_SAMPLE_DAYS", 30.0, type_cast=float)
# Demand buckets: fine for as long as the forecaster reads them, hourly (summed) after, then gone.
PREWARM_DEMAND_FINE_DAYS = get_from_env(
    "PREWARM_DEMAND_FINE_DAYS", PREWARM_FORECAST_HISTORY_DAYS, type_cast=float
)
PREWARM_DEMAND_DAYS = get_from_env("PREWARM_DEMAND_DAYS", 90.0, type_cast=float)
# Forecasts: the latest per key always stays; older ones this long (the dashboard's band history).
PREWARM_FORECAST_KEEP_HOURS = get_from_env("PREWARM_FORECAST_KEEP_HOURS", 24.0, type_cast=float)
# Finished jobs (with their transitions) and decided plans (with their items).
PREWARM_JOB_KEEP_DAYS = get_from_env("PREWARM_JOB_KEEP_DAYS", 30.0, type_cast=float)
# The audit trail is kept, but not forever: an admin sets the horizon (days; 0 = keep all).
PREWARM_AUDIT_KEEP_DAYS = get_from_env("PREWARM_AUDIT_KEEP_DAYS", 365.0, type_cast=float)
# The scoreboard gives no verdict before this many speculative replicas have been scored.
PREWARM_SCOREBOARD_MIN_REPLICAS = get_from_env("PREWARM_SCOREBOARD_MIN_REPLICAS", 20, type_cast=int)
# The fleet doctor (controlplane/core/doctor.py, docs/deploy.md "Troubleshooting KV-aware
# routing"): the topic the router takes ("" for vllm-router; "*" for routers that take any), how
# long an engine may store new blocks without an event, the fewest requests a share is judged
# on, and the shares of short prompts and of predicted hits served cold that are findings.
PREWARM_DOCTOR_ROUTER_TOPIC = get_from_env("PREWARM_DOCTOR_ROUTER_TOPIC", "")
PREWARM_DOCTOR_EVENTS_SILENT_SECONDS = get_from_env(
    "PREWARM_DOCTOR_EVENTS_SILENT_SECONDS", 30.0, type_cast=float
)
PREWARM_DOCTOR_MIN_REQUESTS = get_from_env("PREWARM_DOCTOR_MIN_REQUESTS", 3, type_cast=int)
PREWARM_DOCTOR_SHORT_SHARE = get_from_env("PREWARM_DOCTOR_SHORT_SHARE", 0.2, type_cast=float)
PREWARM_DOCTOR_COLD_SHARE = get_from_env("PREWARM_DOCTOR_COLD_SHARE", 0.3, type_cast=float)
