"""Demand housekeeping on the ``default`` queue."""

from controlplane.queues import Queue, task

from . import services


@task(Queue.DEFAULT)
def retention() -> dict:
    """Fine demand buckets roll up into hourly ones past the forecaster's window (docs/reliability.md)."""
    return {
        **services.downsample_demand(),
        "prefix_token_ids_forgotten": services.forget_prefix_tokens(),
    }
