"""Demand as measured from request records, not forecast: what both strategies plan on (the
shared rule, ``core.policy.demand``), and what shows a hot spot or a burst's onset at ingest
(``react``)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Min, Sum

from controlplane.core.policy import onset
from controlplane.core.policy.demand import MEASURE_WINDOW_S
from controlplane.core.policy.strategy import STRATEGY_PREDICTIVE
from controlplane.demand.models import DemandBucket


def measured_rates(key_ids, now) -> dict[int, float]:
    """Requests/s of each workload key (all of them with ``key_ids`` None) over the demand
    buckets covering the last ``MEASURE_WINDOW_S``: their requests over the time since the
    first of those buckets began."""
    bucket = settings.PREWARM_DEMAND_BUCKET_SECONDS
    t = now.timestamp()
    first = (t - MEASURE_WINDOW_S) // bucket * bucket
    rows = DemandBucket.objects.filter(start__gte=datetime.fromtimestamp(first, tz=UTC))
    if key_ids is not None:
        rows = rows.filter(key_id__in=list(key_ids))
    out = {}
    for key, n, start in (
        rows.values_list("key_id").annotate(n=Sum("requests"), s=Min("start")).order_by()
    ):
        span = max(MEASURE_WINDOW_S, t - start.timestamp())
        if n:
            out[key] = n / span
    return out


def arrival_rates(times: list[float], window_s: float) -> float:
    """Requests/s over the last ``window_s`` of a batch's arrival times (unix seconds)."""
    if not times:
        return 0.0
    last = max(times)
    return sum(1 for x in times if x > last - window_s) / window_s


def ingest_demand(
    arrivals: dict[int, list[float]], strategy: str, now
) -> tuple[dict[int, float], set[int]]:
    """Per workload key seen in an ingest, the demand to plan on now, and the keys at a burst's
    onset: its measured rate over the last minute; under ``predictive`` the rate of a burst's
    onset where the batch shows one (``core.policy.onset``: the last seconds' rate against the
    minute's). Keys with fewer than ``onset.ONSET_MIN_ARRIVALS`` requests in the minute are
    left to the next cycle."""
    minute = measured_rates(list(arrivals), now)
    out, onsets = {}, set()
    for key, rate in minute.items():
        if rate * MEASURE_WINDOW_S < onset.ONSET_MIN_ARRIVALS:
            continue
        if strategy == STRATEGY_PREDICTIVE:
            short = arrival_rates(arrivals.get(key, []), onset.ONSET_WINDOW_S)
            at_onset = onset.onset_rate(short_rate=short, long_rate=rate)
            if at_onset > 0:
                onsets.add(key)
                rate = at_onset
        out[key] = rate
    return out, onsets
