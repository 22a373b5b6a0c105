"""Demand housekeeping on the ``default`` queue."""

from celery import shared_task

from . import services


@shared_task
def retention() -> dict:
    """Fine demand buckets roll up into hourly ones past the forecaster's window (docs/reliability.md)."""
    return {
        **services.downsample_demand(),
        "prefix_token_ids_forgotten": services.forget_prefix_tokens(),
    }
