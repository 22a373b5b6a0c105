"""The baselines, their backtest, the per-key choice and burst risk for many keys at once (numpy).

`forecast_counts` forecasts one key in Python; a forecast tick of 10,000 keys cannot afford that
(the EWMA recursion alone is a Python loop per key, alpha and fold). Here every key's history is
one row of a matrix, right-aligned so that column ``W - 1`` is every key's newest bucket (ending
at the tick's ``start``) and key ``i``'s history is its last ``lengths[i]`` columns (zeros to the
left of it are ignored). Because the rows are right-aligned, a backtest fold's origin is one
column for every key; only whether the key's history reaches back far enough differs per key.

The results are those of ``forecast_counts(row, models=...)`` for each row with the same cheap
models (``ARRAY_MODELS``): same fold origins, same MASE scale, same choice rule (most folds, then
lowest mean, challengers compared on the folds they share), same intervals, up to float rounding
in sums (``tests/core/test_forecast_arrays.py`` checks them against each other). Prophet is not
here: it is fitted off the tick path and its forecast is read from the fitted state.

`burst_risk_arrays` is ``core.demand.risk_from_counts`` over each key's last ``RECENT_BUCKETS``
buckets, the negative binomial tail summed for all keys at once (in chunks of a bounded table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controlplane.core.forecast.baselines import Ewma, SeasonalBlend, SeasonalNaive
from controlplane.core.forecast.burst import _NEGBIN_MAX_TERMS, BURST_FACTOR
from controlplane.core.forecast.series import season_length, z_for

ARRAY_MODELS = ("last_value", "ewma", "seasonal_naive", "seasonal_blend")
FALLBACK_MODEL = "last_value"
#: The window burst risk reads its rate and dispersion from (as the per-key path does).
RECENT_BUCKETS = 10
#: Cells of the padded negative-binomial table computed in one numpy call (memory bound).
_NEGBIN_CHUNK_CELLS = 2_000_000


@dataclass(frozen=True)
class ArrayForecast:
    """The chosen forecast of every row: ``model[i]`` indexes ``models``; ``scores[i, j]`` is
    model j's mean backtest MASE (NaN where it was not scored) over ``folds[i, j]`` folds."""

    models: tuple[str, ...]
    model: np.ndarray  # (N,) int
    yhat: np.ndarray  # (N, H)
    lower: np.ndarray
    upper: np.ndarray
    backtest_mase: np.ndarray  # (N,) NaN when unscored
    scores: np.ndarray  # (N, M)
    folds: np.ndarray  # (N, M) int
    predictions: dict[str, np.ndarray]  # every model's yhat (N, H), NaN where it refused

    def model_name(self, i: int) -> str:
        return self.models[int(self.model[i])]

    def scores_of(self, i: int) -> dict[str, float]:
        return {
            m: float(self.scores[i, j]) for j, m in enumerate(self.models) if self.folds[i, j] > 0
        }


def right_aligned(series: Sequence[np.ndarray], width: int | None = None) -> tuple:
    """``(matrix, lengths)`` from per-key histories (oldest first), each right-aligned; a history
    longer than ``width`` keeps its newest ``width`` buckets."""
    lengths = np.array([len(s) for s in series], dtype=np.int64)
    width = int(lengths.max(initial=0)) if width is None else width
    lengths = np.minimum(lengths, width)
    out = np.zeros((len(series), width))
    for i, s in enumerate(series):
        if lengths[i]:
            out[i, width - lengths[i] :] = s[len(s) - lengths[i] :]
    return out, lengths


class _Stats:
    """Sums over each row's own history (columns before its first bucket masked out), up to the
    given end columns: absolute lag-1 differences (MASE scale), squared lag-1 and lag-m
    differences (sigmas). One pass over the matrix in column blocks, so memory stays at one
    block whatever the history length."""

    BLOCK = 256

    def __init__(self, y: np.ndarray, first: np.ndarray, m: int | None, ends) -> None:
        n, w = y.shape
        self.first, self.m = first, m
        self._abs1: dict[int, np.ndarray] = {}
        self._sq1: dict[int, np.ndarray] = {}
        self._sqm: dict[int, np.ndarray] = {}
        acc = [np.zeros(n), np.zeros(n), np.zeros(n)]
        done = 0
        for end in sorted(set(ends)):
            for lo in range(done, end, self.BLOCK):
                hi = min(end, lo + self.BLOCK)
                cols = np.arange(lo, hi)
                a = max(lo, 1)
                if a < hi:
                    d = y[:, a:hi] - y[:, a - 1 : hi - 1]
                    d = np.where(cols[None, a - lo :] > first[:, None], d, 0.0)
                    acc[0] += np.abs(d).sum(axis=1)
                    acc[1] += (d * d).sum(axis=1)
                if m is not None:
                    b = max(lo, m)
                    if b < hi:
                        s = y[:, b:hi] - y[:, b - m : hi - m]
                        s = np.where(cols[None, b - lo :] >= first[:, None] + m, s, 0.0)
                        acc[2] += (s * s).sum(axis=1)
            done = max(done, end)
            self._abs1[end], self._sq1[end], self._sqm[end] = (a.copy() for a in acc)

    def mase_scale(self, end: int) -> np.ndarray:
        count = end - 1 - self.first
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = self._abs1[end] / count
        return np.where((count >= 1) & (scale > 0), scale, 1.0)

    def sigma1(self, end: int) -> np.ndarray:
        count = end - 1 - self.first
        with np.errstate(invalid="ignore", divide="ignore"):
            s = np.sqrt(self._sq1[end] / count)
        return np.where(count >= 1, s, 0.0)

    def sigma_season(self, end: int) -> np.ndarray:
        assert self.m is not None
        count = end - self.first - self.m
        with np.errstate(invalid="ignore", divide="ignore"):
            s = np.sqrt(self._sqm[end] / count)
        return np.where(count >= 1, s, 0.0)


def _ewma(y: np.ndarray, first: np.ndarray, end: int, bucket_s: int) -> tuple:
    """Ewma().fit on columns < end for every row: (level, sigma, alpha) arrays."""
    alphas = np.array(Ewma.alphas)[:, None]
    window = max(2, Ewma.fit_window_s // bucket_s)
    start = np.maximum(first, end - window)  # each row's `recent[0]`
    rows = np.arange(y.shape[0])
    level = np.broadcast_to(y[rows, np.minimum(start, end - 1)], (len(alphas), len(rows))).copy()
    sse = np.zeros_like(level)
    lo = max(0, end - window)
    cols = np.ascontiguousarray(y[:, lo:end].T)  # one contiguous row per time step
    e, tmp, active = np.empty_like(level), np.empty_like(level), np.empty(len(rows), dtype=bool)
    for t in range(lo + 1, end):
        np.subtract(cols[t - lo], level, out=e)
        np.greater(t, start, out=active)
        e *= active  # rows whose history starts later: no error, no update (level + a * 0)
        np.multiply(e, e, out=tmp)
        sse += tmp
        np.multiply(alphas, e, out=tmp)
        level += tmp
    best = np.argmin(sse, axis=0)  # first of equal errors, as the per-key loop keeps the first
    n_recent = end - start
    sigma = np.sqrt(sse[best, rows] / np.maximum(n_recent - 1, 1))
    return level[best, rows], sigma, alphas[best, 0]


def _predict(
    name: str,
    y: np.ndarray,
    first: np.ndarray,
    end: int,
    horizon: int,
    bucket_s: int,
    stats: _Stats,
    with_sigma: bool,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Model ``name`` fitted on columns < end of every row: (yhat, sigma) of shape (N, H)."""
    h = np.arange(horizon)
    m = stats.m
    if name == "last_value":
        yhat = np.repeat(y[:, end - 1 : end], horizon, axis=1)
        sigma = stats.sigma1(end)[:, None] * np.sqrt(h + 1.0) if with_sigma else None
    elif name == "ewma":
        level, s, alpha = _ewma(y, first, end, bucket_s)
        yhat = np.repeat(level[:, None], horizon, axis=1)
        sigma = s[:, None] * np.sqrt(1 + h[None, :] * alpha[:, None] ** 2) if with_sigma else None
    elif name == "seasonal_naive":
        assert m is not None
        yhat = y[:, end - m + (h % m)]
        sigma = stats.sigma_season(end)[:, None] * np.sqrt(h // m + 1.0) if with_sigma else None
    elif name == "seasonal_blend":
        assert m is not None
        k = max(1, SeasonalBlend.level_window_s // bucket_s)
        level = y[:, end - k : end].mean(axis=1)
        lead_s = (np.arange(m) + 1) * bucket_s
        w = np.exp(-lead_s / SeasonalBlend.tau_s)[np.minimum(h, m - 1)]
        yhat = w * level[:, None] + (1 - w) * y[:, end - m + (h % m)]
        sigma = None
        if with_sigma:
            sigma = (
                w * stats.sigma1(end)[:, None] * np.sqrt(h + 1.0)
                + (1 - w) * stats.sigma_season(end)[:, None]
            )
    else:
        raise ValueError(f"{name} has no array form; array models: {', '.join(ARRAY_MODELS)}")
    return np.maximum(yhat, 0.0), sigma


def _min_history(name: str, bucket_s: int) -> int:
    if name in ("seasonal_naive", "seasonal_blend"):
        return SeasonalNaive().min_history(bucket_s)
    return 1


def _choose(means: np.ndarray, fold_mase: np.ndarray) -> np.ndarray:
    """``select._choose`` for every row: ``fold_mase`` (N, M, K) NaN where a fold is absent."""
    present = ~np.isnan(fold_mase)
    nf = present.sum(axis=2)
    n, m = nf.shape
    idx = np.broadcast_to(np.arange(m), (n, m))
    # Unscored models sort last; then most folds, lowest mean, registry order (a stable sort).
    key_nf = np.where(nf > 0, -nf, 1)
    key_mean = np.where(nf > 0, means, np.inf)
    order = np.lexsort((idx, key_mean, key_nf), axis=1)
    rows = np.arange(n)
    best = order[:, 0]
    for p in range(1, m):
        chal = order[:, p]
        common = present[rows, best] & present[rows, chal]
        cnt = common.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mb = np.where(common, fold_mase[rows, best], 0.0).sum(axis=1) / cnt
            mc = np.where(common, fold_mase[rows, chal], 0.0).sum(axis=1) / cnt
        better = (nf[rows, chal] > 0) & (cnt > 0) & (mc < mb)
        best = np.where(better, chal, best)
    return best


def forecast_arrays(
    y: np.ndarray,
    lengths: np.ndarray,
    *,
    bucket_s: int,
    horizon: int,
    models: Sequence[str] = ARRAY_MODELS,
    interval: float = 0.8,
    backtest_folds: int = 3,
) -> ArrayForecast:
    """``forecast_counts`` of every row of ``y`` (right-aligned, see the module docstring) with
    the array models: backtest, choice, final fit and interval, for all rows at once."""
    y = np.asarray(y, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if y.ndim != 2 or lengths.shape != (y.shape[0],):
        raise ValueError("y must be (keys, buckets) and lengths one per key")
    n, w = y.shape
    if (lengths < 1).any() or (lengths > w).any():
        raise ValueError("every key needs 1..width buckets of history")
    if not np.isfinite(y).all() or (y < 0).any():
        raise ValueError("counts must be finite and non-negative")
    if horizon <= 0 or bucket_s <= 0 or backtest_folds < 0:
        raise ValueError("horizon and bucket_s must be > 0, backtest_folds >= 0")
    models = tuple(models)
    unknown = [m for m in models if m not in ARRAY_MODELS]
    if unknown or not models:
        raise ValueError(f"no array form for {unknown}; array models: {', '.join(ARRAY_MODELS)}")
    first = w - lengths
    m = season_length(bucket_s)
    origins = [w - horizon * k for k in range(backtest_folds, 0, -1)]
    stats = _Stats(y, first, m, [o for o in origins if o > 0] + [w])
    fold_mase = np.full((n, len(models), max(backtest_folds, 1)), np.nan)
    eligible = np.zeros((n, len(models)), dtype=bool)
    for j, name in enumerate(models):
        min_hist = _min_history(name, bucket_s)
        eligible[:, j] = lengths >= min_hist
        for k in range(backtest_folds, 0, -1):
            origin = w - horizon * k  # the fold's first test column, shared by every row
            fold_ok = eligible[:, j] & (origin - first >= max(min_hist, 2))
            if origin <= 0 or not fold_ok.any():
                continue
            yhat, _ = _predict(name, y, first, origin, horizon, bucket_s, stats, False)
            err = np.abs(y[:, origin : origin + horizon] - yhat).mean(axis=1)
            fold_mase[:, j, backtest_folds - k] = np.where(
                fold_ok, err / stats.mase_scale(origin), np.nan
            )
    folds = (~np.isnan(fold_mase)).sum(axis=2)
    with np.errstate(invalid="ignore"):
        means = np.where(folds > 0, np.nansum(fold_mase, axis=2) / np.maximum(folds, 1), np.nan)
    chosen = _choose(means, fold_mase)
    scored = folds.max(axis=1) > 0
    fallback = models.index(FALLBACK_MODEL) if FALLBACK_MODEL in models else 0
    chosen = np.where(scored, chosen, fallback)
    if not eligible[np.arange(n), chosen].all():
        raise ValueError("a key with no array model accepting its history")
    z = z_for(interval)
    yhat_all = np.zeros((n, horizon))
    sigma_all = np.zeros((n, horizon))
    predictions = {}
    for j, name in enumerate(models):
        if not eligible[:, j].any():
            continue
        yh, sg = _predict(name, y, first, w, horizon, bucket_s, stats, True)
        assert sg is not None
        predictions[name] = np.where(eligible[:, j, None], yh, np.nan)
        pick = (chosen == j)[:, None]
        yhat_all = np.where(pick, yh, yhat_all)
        sigma_all = np.where(pick, sg, sigma_all)
    half = z * sigma_all
    return ArrayForecast(
        models=models,
        model=chosen,
        yhat=yhat_all,
        lower=np.maximum(yhat_all - half, 0.0),
        upper=yhat_all + half,
        backtest_mase=np.where(scored, means[np.arange(n), chosen], np.nan),
        scores=means,
        folds=folds,
        predictions=predictions,
    )


def burst_risk_arrays(
    y: np.ndarray, lengths: np.ndarray, bucket_s: float, horizon_s: float
) -> np.ndarray:
    """``risk_from_counts(history[-RECENT_BUCKETS:], bucket_s, horizon_s)`` of every row
    (capacity: ``BURST_FACTOR`` x the recent rate, the forecast task's knowledge)."""

    n, w = y.shape
    r = np.minimum(np.asarray(lengths), RECENT_BUCKETS)
    cols = np.arange(w - RECENT_BUCKETS, w) if w >= RECENT_BUCKETS else np.arange(w)
    recent = y[:, cols]
    use = cols[None, :] >= (w - r)[:, None]
    cnt = np.maximum(r, 1)
    mean = np.where(use, recent, 0.0).sum(axis=1) / cnt
    var = np.where(use, (recent - mean[:, None]) ** 2, 0.0).sum(axis=1) / cnt
    with np.errstate(invalid="ignore", divide="ignore"):
        cv2 = np.maximum(var / mean, 1e-6)  # cv^2, as risk_from_counts' sqrt(max(var/mean, 1e-6))
    cv = np.sqrt(cv2)
    rate = mean / bucket_s
    window_s = r * bucket_s
    mu = rate * horizon_s
    nvar = mu * cv**2 * (1 + horizon_s / np.where(window_s > 0, window_s, 1.0))
    k = np.floor(BURST_FACTOR * rate * horizon_s)
    risk = np.zeros(n)
    live = (r > 0) & (mean > 0) & (mu > 0)
    negbin = live & (nvar > mu * (1 + 1e-9)) & (k <= _NEGBIN_MAX_TERMS)
    normal = live & ~negbin
    if normal.any():
        erfc = np.frompyfunc(math.erfc, 1, 1)
        sd = np.sqrt(2 * nvar[normal])
        with np.errstate(invalid="ignore", divide="ignore"):
            arg = (k[normal] + 0.5 - mu[normal]) / sd
        val = 0.5 * erfc(arg).astype(np.float64)
        risk[normal] = np.where(nvar[normal] > 0, val, (mu[normal] > k[normal]).astype(float))
    idx = np.flatnonzero(negbin)
    if len(idx):
        risk[idx] = _negbin_sf_many(k[idx].astype(np.int64), mu[idx], nvar[idx])
    return risk


def _negbin_sf_many(k: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``burst._negbin_sf`` for many (k, mu, var): rows sorted by k, summed in padded chunks."""
    assert _NEGBIN_MAX_TERMS + 1 <= _NEGBIN_CHUNK_CELLS  # one key's tail always fits a chunk
    out = np.empty(len(k))
    order = np.argsort(k, kind="stable")
    i = 0
    while i < len(order):
        kmax = int(k[order[i]])
        j = i
        # Grow the chunk while its padded table stays within the cell budget.
        while j < len(order) and (j - i + 1) * (int(k[order[j]]) + 1) <= _NEGBIN_CHUNK_CELLS:
            kmax = int(k[order[j]])
            j += 1
        rows = order[i:j]
        size = mu[rows] * mu[rows] / (var[rows] - mu[rows])
        p = size / (size + mu[rows])
        jj = np.arange(1, kmax + 1, dtype=np.float64)
        # log pmf(j) = size log p + sum_{i<=j} [log((i - 1 + size) / i) + log(1 - p)], built in
        # one preallocated table with in-place operations (few passes over the chunk's cells).
        table = np.empty((len(rows), kmax + 1))
        steps = table[:, 1:]
        np.add(jj[None, :] - 1, size[:, None], out=steps)
        np.divide(steps, jj[None, :], out=steps)
        np.log(steps, out=steps)
        steps += np.log1p(-p)[:, None]
        table[:, 0] = 0.0
        np.cumsum(table, axis=1, out=table)
        table += (size * np.log(p))[:, None]
        np.exp(table, out=table)
        table[np.arange(kmax + 1)[None, :] > k[rows][:, None]] = 0.0
        cdf = table.sum(axis=1)
        out[rows] = np.clip(1.0 - cdf, 0.0, 1.0)
        i = j
    return out
