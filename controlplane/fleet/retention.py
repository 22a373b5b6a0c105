"""GPU samples kept at full resolution for a while, then as hourly averages, then not at all."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count
from django.db.models.functions import TruncHour
from django.utils import timezone

from .models import GpuSample


@transaction.atomic
def downsample_gpu_samples(now=None) -> dict:
    """Past the fine horizon, each GPU keeps one averaged sample an hour; past the last, none."""
    now = now or timezone.now()
    fine_cutoff = now - timedelta(hours=settings.PREWARM_GPU_SAMPLE_FINE_HOURS)
    # Only whole hours are rolled up, so a later run never re-averages a partial hour.
    fine_cutoff = fine_cutoff.replace(minute=0, second=0, microsecond=0)
    deleted, _ = GpuSample.objects.filter(
        at__lt=now - timedelta(days=settings.PREWARM_GPU_SAMPLE_DAYS)
    ).delete()
    hours = (
        GpuSample.objects.filter(at__lt=fine_cutoff)
        .annotate(hour=TruncHour("at"))
        .values("gpu_id", "hour")
        .annotate(
            n=Count("id"),
            mem=Avg("memory_used"),
            kv=Avg("kv_bytes"),
            spec=Avg("speculative_bytes"),
            util=Avg("utilization_gpu"),
        )
        .filter(n__gt=1)
    )
    rolled = [
        GpuSample(
            gpu_id=h["gpu_id"],
            at=h["hour"],
            memory_used=_int_or_none(h["mem"]),
            kv_bytes=_int_or_none(h["kv"]),
            speculative_bytes=_int_or_none(h["spec"]),
            utilization_gpu=h["util"],
        )
        for h in hours
    ]
    merged = 0
    for row in rolled:
        end = row.at + timedelta(hours=1)
        merged += GpuSample.objects.filter(gpu_id=row.gpu_id, at__gte=row.at, at__lt=end).delete()[
            0
        ]
    GpuSample.objects.bulk_create(rolled)
    return {
        "gpu_samples_deleted": deleted,
        "gpu_samples_merged": merged,
        "gpu_samples_hourly": len(rolled),
    }


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)
