"""Reading demand buckets and writing forecasts, in bulk: rows of a bucket window as arrays (COPY on
PostgreSQL), a key's history, the tick's forecasts in one COPY, and the pruning of old ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from controlplane.demand.models import DemandBucket, WorkloadKey

from ..models import Forecast


def history(key_id: int, bucket_s: int, end: float, days: float) -> np.ndarray:
    """Requests per bucket, oldest first, from the key's first bucket (at most ``days`` back)
    to ``end``; missing buckets are zeros."""
    since = datetime.fromtimestamp(end - days * 86400, tz=UTC)
    rows = list(
        DemandBucket.objects.filter(
            key_id=key_id,
            seconds=bucket_s,
            start__gte=since,
            start__lt=datetime.fromtimestamp(end, tz=UTC),
        ).values_list("start", "requests")
    )
    if not rows:
        return np.zeros(0)
    first = min(r[0] for r in rows).timestamp()
    n = int(round((end - first) / bucket_s))
    out = np.zeros(n)
    for start, count in rows:
        out[int((start.timestamp() - first) // bucket_s)] += count
    return out


def keys_to_forecast(now=None) -> list[int]:
    """Keys with demand in the recent history window."""
    now = now or timezone.now()
    since = now - timedelta(days=settings.PREWARM_FORECAST_HISTORY_DAYS)
    return list(WorkloadKey.objects.filter(last_seen__gte=since).values_list("pk", flat=True))


def rows_between(since: float, end: float, bucket_s: int, key_ids=None) -> tuple[np.ndarray, ...]:
    """(key_id, bucket start, requests) of every bucket in [since, end), as arrays, one query."""
    if connection.vendor == "postgresql":
        return _rows_copy(since, end, bucket_s, key_ids)
    q = DemandBucket.objects.filter(
        seconds=bucket_s,
        start__gte=datetime.fromtimestamp(since, tz=UTC),
        start__lt=datetime.fromtimestamp(end, tz=UTC),
    )
    if key_ids is not None:
        q = q.filter(key_id__in=list(key_ids))
    rows = list(q.values_list("key_id", "start", "requests"))
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    keys, starts, counts = zip(*rows, strict=True)
    return (
        np.fromiter(keys, np.int64, len(rows)),
        np.fromiter((d.timestamp() for d in starts), np.float64, len(rows)),
        np.fromiter(counts, np.float64, len(rows)),
    )


def _rows_copy(since: float, end: float, bucket_s: int, key_ids=None) -> tuple[np.ndarray, ...]:
    """``rows_between`` on PostgreSQL: COPY of three integer columns, parsed by numpy in one call (a
    cold window of millions of rows would spend most of its time making Python objects)."""
    table = DemandBucket._meta.db_table
    where = "seconds = %s AND start >= to_timestamp(%s) AND start < to_timestamp(%s)"
    params: list = [bucket_s, since, end]
    if key_ids is not None:
        where += " AND key_id = ANY(%s)"
        params.append(list(key_ids))
    sql = (
        f"COPY (SELECT key_id, extract(epoch FROM start)::bigint, requests FROM {table} "
        f"WHERE {where}) TO STDOUT"
    )
    chunks = []
    with connection.cursor() as cur, cur.cursor.copy(sql, params) as copy:
        for block in copy:
            chunks.append(bytes(block))
    data = b"".join(chunks)
    if not data:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    text = data.replace(b"\t", b" ").decode()
    flat = np.fromstring(text, dtype=np.int64, sep=" ").reshape(-1, 3)  # text mode: not deprecated
    return flat[:, 0], flat[:, 1].astype(np.float64), flat[:, 2].astype(np.float64)


# A forecast's values, as the tick writes them and the API shows them.
FORECAST_VALUES = (
    "start",
    "bucket_s",
    "horizon",
    "yhat",
    "lower",
    "upper",
    "model",
    "backtest_mase",
    "scores",
    "burst_risk",
    "note",
)
FORECAST_COLUMNS = ("key_id", *FORECAST_VALUES)


def store_forecasts(rows: list[dict]) -> None:
    """Insert the tick's forecasts (field dicts): COPY on PostgreSQL, ``bulk_create`` elsewhere."""
    if connection.vendor != "postgresql":
        Forecast.objects.bulk_create([Forecast(**r) for r in rows], batch_size=2000)
        return
    import json

    now = timezone.now().isoformat()
    # the columns as the database names them (a field may keep an older column: db_column)
    columns = (Forecast._meta.get_field(c).column for c in FORECAST_COLUMNS)
    cols = ", ".join(("generated_at", *columns))
    # One COPY text buffer for every row (a write_row call and a json.dumps per list cost more
    # than the database's own work here); lists of floats are written as their reprs, which is
    # what json.dumps writes for finite floats.
    lines = []
    for r in rows:
        fields = [now]
        for c in FORECAST_COLUMNS:
            v = r[c]
            if v is None:
                fields.append("\\N")
            elif c in ("yhat", "lower", "upper"):
                fields.append("[" + ", ".join(map(float.__repr__, v)) + "]")
            elif c == "scores":
                fields.append(_copy_text(json.dumps(v)))
            elif c == "start":
                fields.append(v.isoformat())
            else:
                fields.append(_copy_text(str(v)))
        lines.append("\t".join(fields))
    with (
        transaction.atomic(),
        connection.cursor() as cur,
        cur.cursor.copy(f"COPY {Forecast._meta.db_table} ({cols}) FROM STDIN") as copy,
    ):
        copy.write("\n".join(lines) + "\n")


def _copy_text(value: str) -> str:
    """A field of PostgreSQL's COPY text format: backslash, tab and line breaks escaped."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = (
            value.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
    return value


@transaction.atomic
def prune_forecasts(now=None) -> dict:
    """Forecasts older than the keep window go, except each key's latest."""
    now = now or timezone.now()
    latest = (
        Forecast.objects.filter(key_id=OuterRef("key_id"))
        .order_by("-generated_at", "-id")
        .values("id")[:1]
    )
    old = Forecast.objects.filter(
        generated_at__lt=now - timedelta(hours=settings.PREWARM_FORECAST_KEEP_HOURS)
    )
    deleted, _ = old.exclude(id=Subquery(latest)).delete()
    return {"forecasts_deleted": deleted}
