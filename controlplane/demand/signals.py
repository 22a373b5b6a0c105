"""What demand tells the apps above it (they connect in their AppConfig.ready)."""

from django.dispatch import Signal

# Sent inside ingest_records' transaction with ``served``: rows (workload key id, serving engine
# id, unix time, cached tokens, TTFT seconds or None) of the records that named their serving
# engine.
requests_served = Signal()

# Sent inside ingest_records' transaction with ``arrivals``: workload key id -> the unix times of
# the batch's records of that key (keys of a prefix group only, not a tenant's catch-all).
records_ingested = Signal()
