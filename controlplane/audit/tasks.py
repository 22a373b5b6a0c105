"""Audit housekeeping on the ``default`` queue."""

from controlplane.queues import Queue, task

from . import services


@task(Queue.DEFAULT)
def retention() -> dict:
    """Events past the admin-set horizon PREWARM_AUDIT_KEEP_DAYS go (the pruning itself is audited)."""
    return services.prune_audit()
