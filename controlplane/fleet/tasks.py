"""Fleet housekeeping on the ``default`` queue."""

from controlplane.queues import Queue, task

from . import services
from .retention import downsample_gpu_samples


@task(Queue.DEFAULT)
def mark_stale() -> list[int]:
    """Nodes silent past PREWARM_NODE_STALE_SECONDS go stale (their jobs then expire)."""
    return services.mark_stale_nodes()


@task(Queue.DEFAULT)
def retention() -> dict:
    """GPU samples: hourly averages past the fine horizon, none past the last (docs/reliability.md)."""
    return downsample_gpu_samples()
