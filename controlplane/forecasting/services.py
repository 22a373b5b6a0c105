"""Forecast workload keys from their demand buckets and store the results (worker side).

The forecast tick (``forecast_tick``) forecasts every active key at once: the demand of all keys
is one right-aligned matrix kept by the worker process between ticks (``DemandWindow``; each tick
reads only the buckets since the last one, in one query), the baselines, their backtest, the
choice and burst risk are array work (``core.forecast.arrays``), and Prophet's forecast is read
from its fitted state (``FittedModel``), which ``fit_slow_model`` refits off the tick path on the
``forecast-slow`` queue, a few keys per tick under ``PREWARM_FORECAST_SLOW_FITS_PER_HOUR``.

``forecast_key`` is the per-key path (one key, every model, Prophet fitted inline). It calls the pure forecasters (``controlplane.core.forecast``): every model that accepts the key's
history is backtested and the best kept; a key with too little history gets the baseline the
forecasters fall back to, and the stored ``note`` says so. Burst risk is the chance that the
next horizon brings more than ``core.demand.BURST_FACTOR`` x the recent rate, from the recent
rate and the dispersion of recent bucket counts: ``controlplane.core.demand.risk_from_counts``, the demand
model the simulator's predictive policy shares.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone

from controlplane.core.demand import risk_from_counts
from controlplane.core.forecast import FORECASTERS, PROPHET_MIN_HISTORY_S, forecast_counts
from controlplane.demand.models import DemandBucket, WorkloadKey

from .models import FittedModel, Forecast

log = logging.getLogger(__name__)
__all__ = [
    "DemandWindow",
    "fit_slow_model",
    "forecast_key",
    "forecast_tick",
    "history",
    "keys_to_forecast",
    "risk_of",
    "slow_fits_due",
]
RECENT_BUCKETS = 10  # the window burst risk reads its rate and dispersion from


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


def risk_of(counts: np.ndarray, bucket_s: int, horizon_s: float) -> float:
    return risk_from_counts(counts[-RECENT_BUCKETS:], bucket_s, horizon_s)


def forecast_key(key_id: int, horizon_s: float, now=None) -> Forecast | None:
    """Forecast one key's next ``horizon_s`` and store it; None if the key vanished or has no
    demand yet."""
    if not WorkloadKey.objects.filter(pk=key_id).exists():
        log.info("forecast: workload key %s vanished", key_id)
        return None
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    now = (now or timezone.now()).timestamp()
    # The current bucket is still filling: history ends at its start.
    end = float(now // bucket_s * bucket_s)
    counts = history(key_id, bucket_s, end, settings.PREWARM_FORECAST_HISTORY_DAYS)
    if counts.sum() <= 0:
        return None
    horizon = max(1, math.ceil(horizon_s / bucket_s))
    res = forecast_counts(
        counts,
        start=end,
        bucket_seconds=bucket_s,
        horizon=horizon,
        models=settings.PREWARM_FORECAST_MODELS or None,
        backtest_folds=settings.PREWARM_FORECAST_BACKTEST_FOLDS,
    )
    note = res.note
    if res.backtest_mase is None:
        note = f"baseline only ({len(counts)} buckets of history): " + note
    f = Forecast.objects.create(
        key_id=key_id,
        start=datetime.fromtimestamp(res.start, tz=UTC),
        bucket_seconds=bucket_s,
        horizon=horizon,
        yhat=[round(float(v), 4) for v in res.yhat],
        lower=[round(float(v), 4) for v in res.lower],
        upper=[round(float(v), 4) for v in res.upper],
        model=res.model,
        backtest_mase=res.backtest_mase,
        scores={k: (None if not math.isfinite(v) else v) for k, v in res.scores.items()},
        burst_risk=risk_of(counts, bucket_s, horizon_s),
        note=note[:4000],
    )
    return f  # no page shows forecasts live (the forecasts page reads the table on load)


def keys_to_forecast(now=None) -> list[int]:
    """Keys with demand in the recent history window."""
    now = now or timezone.now()
    since = now - timedelta(days=settings.PREWARM_FORECAST_HISTORY_DAYS)
    return list(WorkloadKey.objects.filter(last_seen__gte=since).values_list("pk", flat=True))


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


# ---------------------------------------------------------------------------------------------
# The forecast tick: every active key at once.

#: Buckets before the previous tick's end that a tick reads again (request records that arrive
#: after their bucket closed: a gateway's batch, a retried post).
REREAD_BUCKETS = 3
#: A worker's window older than this is read again in full (late records beyond the re-read).
WINDOW_MAX_AGE_S = 3600.0
SLOW_MODEL = "prophet"
#: Fit buckets of Prophet's expected counts stored per refit: a day and a bit, so a tick may
#: read them until the next refit of the key comes round.
SLOW_FIT_SPAN = 26


def _tick_buckets(bucket_s: int) -> int:
    """Columns of the tick's window: PREWARM_FORECAST_TICK_DAYS, at least 2 buckets."""
    return max(2, int(settings.PREWARM_FORECAST_TICK_DAYS * 86400 // bucket_s))


def _rows(since: float, end: float, bucket_s: int, key_ids=None) -> tuple[np.ndarray, ...]:
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
    """``_rows`` on PostgreSQL: COPY of three integer columns, parsed by numpy in one call (a
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


_COLUMNS = (
    "key_id",
    "start",
    "bucket_seconds",
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
_JSON_COLUMNS = frozenset({"yhat", "lower", "upper", "scores"})


def _store(rows: list[dict]) -> None:
    """Insert the tick's forecasts (field dicts): COPY on PostgreSQL, ``bulk_create`` elsewhere."""
    if connection.vendor != "postgresql":
        Forecast.objects.bulk_create([Forecast(**r) for r in rows], batch_size=2000)
        return
    import json

    now = timezone.now().isoformat()
    cols = ", ".join(("generated_at", *_COLUMNS))
    # One COPY text buffer for every row (a write_row call and a json.dumps per list cost more
    # than the database's own work here); lists of floats are written as their reprs, which is
    # what json.dumps writes for finite floats.
    lines = []
    for r in rows:
        fields = [now]
        for c in _COLUMNS:
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


class DemandWindow:
    """Requests per bucket of every active key over the tick's window, right-aligned at ``end``
    (``core.forecast.arrays``), and each key's first bucket; kept in the worker process between
    ticks so a tick reads only what is new."""

    def __init__(self, bucket_s: int, width: int) -> None:
        self.bucket_s, self.width = bucket_s, width
        self.end = -math.inf
        self.loaded_at = -math.inf
        self.key_ids = np.zeros(0, np.int64)
        self.y = np.zeros((0, width))
        self.first = np.zeros(0)  # unix time of each key's first bucket seen

    def lengths(self) -> np.ndarray:
        seen = np.isfinite(self.first)
        n = np.zeros(len(self.first), np.int64)
        n[seen] = np.round((self.end - self.first[seen]) / self.bucket_s)
        return np.clip(n, 0, self.width)

    def _put(self, keys: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> None:
        if not len(self.key_ids) or not len(keys):
            return  # no active key, or nothing read: nothing to place
        rows = np.searchsorted(self.key_ids, keys)
        ok = (rows < len(self.key_ids)) & (
            self.key_ids[np.minimum(rows, len(self.key_ids) - 1)] == keys
        )
        col = self.width - np.round((self.end - starts) / self.bucket_s).astype(np.int64)
        ok &= (col >= 0) & (col < self.width)
        self.y[rows[ok], col[ok]] = counts[ok]
        np.minimum.at(self.first, rows[ok], starts[ok])

    def refresh(self, key_ids: list[int], end: float, now: float) -> str:
        """Bring the window to ``end`` for these keys; returns "full" or "incremental"."""
        ids = np.array(sorted(set(key_ids)), dtype=np.int64)
        b, w = self.bucket_s, self.width
        shift = int(round((end - self.end) / b)) if math.isfinite(self.end) else w
        full = shift >= w or shift < 0 or now - self.loaded_at > WINDOW_MAX_AGE_S
        old_ids, old_y, old_first = self.key_ids, self.y, self.first
        self.key_ids, self.end = ids, end
        self.y = np.zeros((len(ids), w))
        self.first = np.full(len(ids), np.inf)
        if full:
            self._put(*_rows(end - w * b, end, b))
            self.loaded_at = now
            return "full"
        # Carry the keys we had, shifted left by the buckets since the last tick.
        pos = np.searchsorted(old_ids, ids)
        had = (pos < len(old_ids)) & (old_ids[np.minimum(pos, max(len(old_ids) - 1, 0))] == ids)
        if len(old_ids):
            src = pos[had]
            self.y[had, : w - shift] = old_y[src, shift:]
            self.first[had] = old_first[src]
        since = end - (shift + REREAD_BUCKETS) * b
        self._put(*_rows(since, end, b))
        new = ids[~had]
        if len(new):  # keys first seen now: their whole window
            self._put(*_rows(end - w * b, end, b, key_ids=new.tolist()))
        return "incremental"


_WINDOWS: dict[tuple[int, int], DemandWindow] = {}


def reset_windows() -> None:
    """Forget this process's demand windows (the next tick reads its window in full)."""
    _WINDOWS.clear()


def demand_window(key_ids: list[int], end: float, now: float) -> tuple[DemandWindow, str]:
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    width = _tick_buckets(bucket_s)
    window = _WINDOWS.setdefault((bucket_s, width), DemandWindow(bucket_s, width))
    return window, window.refresh(key_ids, end, now)


@functools.lru_cache(maxsize=4096)
def _refusals(n: int, bucket_s: int, models: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(r for r in (FORECASTERS[m].refusal(n, bucket_s) for m in models) if r)


def _note(n: int, bucket_s: int, model: str, mase: float, folds: int) -> str:
    """The note ``forecast_key`` would store for this choice."""
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    notes = list(_refusals(n, bucket_s, tuple(m for m in wanted if m in FORECASTERS)))
    if math.isnan(mase):
        return f"baseline only ({n} buckets of history): " + "; ".join(
            [*notes, f"history too short to backtest: {model} unscored"]
        )
    return "; ".join([*notes, f"{model} backtested best (MASE {mase:.3g}, {folds} folds)"])


def _slow_states(key_ids: np.ndarray, end: float) -> dict[int, FittedModel]:
    """Fresh fitted Prophet states (their stored span still covers ``end``) by key."""
    oldest = datetime.fromtimestamp(end - (SLOW_FIT_SPAN - 2) * 3600, tz=UTC)
    return {
        f.key_id: f
        for f in FittedModel.objects.filter(model=SLOW_MODEL, end__gte=oldest).only(
            "key_id",
            "end",
            "bucket_seconds",
            "fit_seconds",
            "values",
            "sigma",
            "backtest_mase",
            "chosen",
        )
        if f.key_id in set(key_ids.tolist())
    }


def forecast_tick(horizon_s: float, now=None) -> dict:
    """Forecast every active key (``keys_to_forecast``) at once and store one ``Forecast`` each.

    The baselines are backtested and chosen per key as ``forecast_key`` does, over the tick's
    window (PREWARM_FORECAST_TICK_DAYS); where the key's Prophet state won its backtest when it was
    fitted and still covers the horizon, its forecast is Prophet's, read from that state. Returns
    the tick's counts and its stage timings (ms)."""
    from controlplane.core.forecast.arrays import (
        ARRAY_MODELS,
        burst_risk_arrays,
        forecast_arrays,
    )
    from controlplane.core.forecast.prophet_model import interpolate_fit
    from controlplane.core.forecast.series import z_for

    t0 = time.perf_counter()
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    now_dt = now or timezone.now()
    end = float(now_dt.timestamp() // bucket_s * bucket_s)
    keys = keys_to_forecast(now_dt)
    window, how = demand_window(keys, end, now_dt.timestamp())
    t_read = time.perf_counter()
    lengths = window.lengths()
    live = (lengths > 0) & (window.y.sum(axis=1) > 0)
    ids, y, n = window.key_ids[live], window.y[live], lengths[live]
    horizon = max(1, math.ceil(horizon_s / bucket_s))
    stamp = {"keys": len(keys), "forecast": 0, "window": how}
    if not len(ids):
        return stamp
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    models = [m for m in ARRAY_MODELS if m in wanted] or [ARRAY_MODELS[0]]
    res = forecast_arrays(
        y,
        n,
        bucket_seconds=bucket_s,
        horizon=horizon,
        models=models,
        backtest_folds=settings.PREWARM_FORECAST_BACKTEST_FOLDS,
    )
    risk = burst_risk_arrays(y, n, bucket_s, horizon_s)
    t_arrays = time.perf_counter()
    slow = _slow_states(ids, end) if SLOW_MODEL in wanted else {}
    z = z_for(0.8)
    start = datetime.fromtimestamp(end, tz=UTC)
    rows = []
    # Rounded for storage as whole matrices (one C call each, not a Python round per value).
    yhats, lowers, uppers = (np.round(a, 4).tolist() for a in (res.yhat, res.lower, res.upper))
    for i, key_id in enumerate(ids.tolist()):
        model = res.model_name(i)
        yhat, lower, upper = yhats[i], lowers[i], uppers[i]
        mase = float(res.backtest_mase[i])
        scores = res.scores_of(i)
        note = _note(int(n[i]), bucket_s, model, mase, int(res.folds[i, res.model[i]]))
        fit = slow.get(key_id)
        if fit is not None and fit.backtest_mase is not None:
            scores[SLOW_MODEL] = fit.backtest_mase
            if fit.chosen and fit.bucket_seconds == bucket_s:
                model, mase = SLOW_MODEL, fit.backtest_mase
                p = np.maximum(
                    interpolate_fit(
                        fit.values, fit.end.timestamp(), fit.fit_seconds, bucket_s, end, horizon
                    ),
                    0.0,
                )
                half = z * fit.sigma
                yhat, lower, upper = (
                    np.round(a, 4).tolist() for a in (p, np.maximum(p - half, 0.0), p + half)
                )
                note = f"prophet won its backtest when fitted at {fit.end:%H:%M} (MASE {mase:.3g})"
        elif int(n[i]) * bucket_s >= PROPHET_MIN_HISTORY_S:
            note += "; prophet not fitted yet (slow-model queue)"
        rows.append(
            dict(
                key_id=key_id,
                start=start,
                bucket_seconds=bucket_s,
                horizon=horizon,
                yhat=yhat,
                lower=lower,
                upper=upper,
                model=model,
                backtest_mase=None if math.isnan(mase) else mase,
                scores={k: (None if not math.isfinite(v) else v) for k, v in scores.items()},
                burst_risk=float(risk[i]),
                note=note[:4000],
            )
        )
    t_rows = time.perf_counter()
    _store(rows)
    t_write = time.perf_counter()
    stamp.update(
        forecast=len(rows),
        prophet=sum(r["model"] == SLOW_MODEL for r in rows),
        ms={
            "read": round((t_read - t0) * 1e3, 1),
            "arrays": round((t_arrays - t_read) * 1e3, 1),
            "rows": round((t_rows - t_arrays) * 1e3, 1),
            "write": round((t_write - t_rows) * 1e3, 1),
            "total": round((t_write - t0) * 1e3, 1),
        },
    )
    return stamp


# ---------------------------------------------------------------------------------------------
# Slow models off the tick path.


def slow_fits_due(now=None, since_last_s: float | None = None) -> list[int]:
    """Keys whose Prophet state is due for a refit, as many as the per-hour budget grants for
    ``since_last_s`` seconds (the time since the previous call): never-fitted keys with 2 days
    of history first, then the oldest fits."""
    budget = settings.PREWARM_FORECAST_SLOW_FITS_PER_HOUR
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    if budget <= 0 or SLOW_MODEL not in wanted:
        return []
    now = now or timezone.now()
    n = math.ceil(budget * min(since_last_s or 3600.0, 3600.0) / 3600.0)
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    # A key's first bucket at least PROPHET_MIN_HISTORY_S ago: it has the history Prophet takes.
    # An EXISTS per key (the (key, start, seconds) index), not a scan of every old bucket.
    cutoff = now - timedelta(seconds=PROPHET_MIN_HISTORY_S)
    old_enough = DemandBucket.objects.filter(
        key_id=OuterRef("pk"), seconds=bucket_s, start__lte=cutoff
    )
    active = WorkloadKey.objects.filter(
        Exists(old_enough),
        last_seen__gte=now - timedelta(days=settings.PREWARM_FORECAST_HISTORY_DAYS),
    )
    fitted = dict(FittedModel.objects.filter(model=SLOW_MODEL).values_list("key_id", "fitted_at"))
    ids = list(active.values_list("pk", flat=True))
    never = [k for k in ids if k not in fitted]
    stale = sorted((k for k in ids if k in fitted), key=fitted.__getitem__)
    return (never + stale)[:n]


def fit_slow_model(key_id: int, horizon_s: float, now=None) -> FittedModel | None:
    """Refit Prophet on one key's whole history (PREWARM_FORECAST_HISTORY_DAYS), backtest it
    against the baselines as ``forecast_key`` does, and store its expected counts for the next
    ``SLOW_FIT_SPAN`` hours; None when the key vanished or has too little history."""
    if not WorkloadKey.objects.filter(pk=key_id).exists():
        log.info("slow fit: workload key %s vanished", key_id)
        return None
    t0 = time.perf_counter()
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    now = (now or timezone.now()).timestamp()
    end = float(now // bucket_s * bucket_s)
    counts = history(key_id, bucket_s, end, settings.PREWARM_FORECAST_HISTORY_DAYS)
    prophet = FORECASTERS[SLOW_MODEL]
    if counts.sum() <= 0 or prophet.refusal(len(counts), bucket_s):
        return None
    wanted = settings.PREWARM_FORECAST_MODELS or list(FORECASTERS)
    res = forecast_counts(
        counts,
        start=end,
        bucket_seconds=bucket_s,
        horizon=max(1, math.ceil(horizon_s / bucket_s)),
        models=wanted,
        backtest_folds=settings.PREWARM_FORECAST_BACKTEST_FOLDS,
    )
    chosen = res.model == SLOW_MODEL
    fitted = res.fitted if chosen else None
    values: list[float] = []
    sigma = 0.0
    fit_s = bucket_s
    if fitted is not None:
        values = [round(float(v), 4) for v in fitted.fit_values(SLOW_FIT_SPAN)]  # type: ignore[attr-defined]
        sigma, fit_s = float(fitted.sigma), int(fitted.fit_seconds)  # type: ignore[attr-defined]
    obj, _ = FittedModel.objects.update_or_create(
        key_id=key_id,
        model=SLOW_MODEL,
        defaults=dict(
            fitted_at=timezone.now(),
            end=datetime.fromtimestamp(end, tz=UTC),
            bucket_seconds=bucket_s,
            fit_seconds=fit_s,
            values=values,
            sigma=sigma,
            backtest_mase=res.scores.get(SLOW_MODEL),
            chosen=chosen,
            fit_ms=round((time.perf_counter() - t0) * 1e3, 1),
            note=res.note[:4000],
        ),
    )
    return obj
