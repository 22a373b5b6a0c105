"""What the fleet tells the apps above it (they connect in their AppConfig.ready)."""

from django.dispatch import Signal

# Sent inside apply_report's transaction, after the residency index took the report's deltas,
# with ``node`` (its pk), ``seq`` (the report's) and ``stored``: engine pk -> the keys the
# report stored on it. Replication confirms landed copies by it (it sits above fleet), so a
# copy is confirmed when the report carrying the evidence is applied, not by a poll.
residency_reported = Signal()
