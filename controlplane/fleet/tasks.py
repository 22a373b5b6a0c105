"""Fleet housekeeping on the ``default`` queue."""

from celery import shared_task

from . import services


@shared_task
def mark_stale() -> list[int]:
    """Nodes silent past PREWARM_NODE_STALE_SECONDS go stale (their jobs then expire)."""
    return services.mark_stale_nodes()


@shared_task
def retention() -> dict:
    """GPU samples: hourly averages past the fine horizon, none past the last (docs/reliability.md)."""
    return services.downsample_gpu_samples()
