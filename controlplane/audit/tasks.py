"""Audit housekeeping on the ``default`` queue."""

from celery import shared_task

from . import services


@shared_task
def retention() -> dict:
    """Events past the admin-set horizon PREWARM_AUDIT_KEEP_DAYS go (the pruning itself is audited)."""
    return services.prune_audit()
