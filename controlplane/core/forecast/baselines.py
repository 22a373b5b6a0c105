"""The forecaster interface and the cheap baselines: last value, EWMA, seasonal naive, and the
seasonal blend (recent level blended with the same window a day earlier).

A `Forecaster` is an immutable configuration; `fit(history, bucket_s=..., end=...)` returns
a `Fitted` model whose `predict(horizon, interval)` gives a `Prediction` (expected count per bucket
and a central interval, all clipped at 0). Intervals of the baselines use the textbook
benchmark-method formulas (Hyndman & Athanasopoulos, *Forecasting: Principles and Practice*,
3rd ed., section 5.5): a Normal interval whose width grows with the lead as each method's
h-step error variance does, from the standard deviation of its in-sample one-step residuals.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from controlplane.core.forecast.series import DAY_S, describe_duration, season_length, z_for


@dataclass(frozen=True)
class Prediction:
    """Expected count per future bucket and the interval around it."""

    yhat: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


def normal_prediction(yhat: np.ndarray, sigma: np.ndarray, interval: float) -> Prediction:
    """yhat +- z * sigma, everything clipped at 0 (counts cannot be negative)."""
    yhat = np.maximum(np.asarray(yhat, dtype=np.float64), 0.0)
    half = z_for(interval) * np.asarray(sigma, dtype=np.float64)
    return Prediction(yhat=yhat, lower=np.maximum(yhat - half, 0.0), upper=yhat + half)


class Fitted(ABC):
    """A forecaster fitted on one history; predicts the buckets right after it."""

    @abstractmethod
    def predict(self, horizon: int, interval: float = 0.8) -> Prediction: ...


class Forecaster(ABC):
    """A forecasting method; instances are stateless and shared (the `FORECASTERS` registry)."""

    name: str

    def min_history(self, bucket_s: int) -> int:
        """Fewest history buckets this method accepts."""
        return 1

    def refusal(self, n_buckets: int, bucket_s: int) -> str | None:
        """Why this method refuses a history of `n_buckets`, or None when it accepts it."""
        if n_buckets >= self.min_history(bucket_s):
            return None
        return f"{self.name} needs >= {self.min_history(bucket_s)} buckets"

    @abstractmethod
    def fit(self, history: np.ndarray, *, bucket_s: int, end: float) -> Fitted: ...


def _residual_sigma(residuals: np.ndarray) -> float:
    return float(np.sqrt(np.mean(residuals**2))) if len(residuals) else 0.0


@dataclass(frozen=True)
class _FlatFit(Fitted):
    level: float
    sigma1: float  # one-step residual standard deviation
    growth: str  # "random_walk" | "ses"
    alpha: float = 1.0

    def predict(self, horizon: int, interval: float = 0.8) -> Prediction:
        h = np.arange(1, horizon + 1, dtype=np.float64)
        if self.growth == "random_walk":
            sigma = self.sigma1 * np.sqrt(h)
        else:  # simple exponential smoothing: var_h = sigma^2 (1 + (h-1) alpha^2)
            sigma = self.sigma1 * np.sqrt(1 + (h - 1) * self.alpha**2)
        return normal_prediction(np.full(horizon, self.level), sigma, interval)


class LastValue(Forecaster):
    """Persistence: every future bucket equals the last observed one."""

    name = "last_value"

    def fit(self, history: np.ndarray, *, bucket_s: int, end: float) -> Fitted:
        sigma = _residual_sigma(np.diff(history))
        return _FlatFit(level=float(history[-1]), sigma1=sigma, growth="random_walk")


def ewma_levels(history: np.ndarray, alpha: float) -> np.ndarray:
    """Level after each observation of simple exponential smoothing, started at the first value."""
    levels = np.empty(len(history))
    level = float(history[0])
    for i, y in enumerate(history):
        level += alpha * (y - level)
        levels[i] = level
    return levels


class Ewma(Forecaster):
    """Simple exponential smoothing; the smoothing factor is chosen from `alphas` by in-sample
    one-step squared error over the last `fit_window_s` of history (older data barely moves the
    level and would only cost time)."""

    name = "ewma"
    alphas = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
    fit_window_s = 2 * DAY_S

    def fit(self, history: np.ndarray, *, bucket_s: int, end: float) -> Fitted:
        recent = history[-max(2, self.fit_window_s // bucket_s) :]
        best: tuple[float, float, float] | None = None  # (sse, alpha, level)
        for alpha in self.alphas:
            levels = ewma_levels(recent, alpha)
            errors = recent[1:] - levels[:-1]
            sse = float(np.sum(errors**2))
            if best is None or sse < best[0]:
                best = (sse, alpha, float(levels[-1]))
        assert best is not None
        sse, alpha, level = best
        sigma = float(np.sqrt(sse / max(len(recent) - 1, 1)))
        return _FlatFit(level=level, sigma1=sigma, growth="ses", alpha=alpha)


@dataclass(frozen=True)
class _SeasonalFit(Fitted):
    last_season: np.ndarray  # the final `m` buckets of history
    sigma1: float  # std of seasonal differences y_t - y_{t-m}

    def predict(self, horizon: int, interval: float = 0.8) -> Prediction:
        m = len(self.last_season)
        h = np.arange(horizon)
        yhat = self.last_season[h % m]
        sigma = self.sigma1 * np.sqrt(h // m + 1)
        return normal_prediction(yhat, sigma, interval)


class SeasonalNaive(Forecaster):
    """Each future bucket equals the same bucket one day earlier (daily season)."""

    name = "seasonal_naive"
    period_s = DAY_S

    def min_history(self, bucket_s: int) -> int:
        m = season_length(bucket_s, self.period_s)
        # A bucket that does not divide a day has no daily season: never applicable.
        return m + 1 if m else 2**62

    def refusal(self, n_buckets: int, bucket_s: int) -> str | None:
        if season_length(bucket_s, self.period_s) is None:
            return f"{self.name} needs a bucket that divides a day ({bucket_s} s does not)"
        if n_buckets >= self.min_history(bucket_s):
            return None
        have = describe_duration(n_buckets * bucket_s)
        return f"only {have} of history: {self.name} needs more than 1 day"

    def fit(self, history: np.ndarray, *, bucket_s: int, end: float) -> Fitted:
        m = season_length(bucket_s, self.period_s)
        if m is None or len(history) <= m:
            raise ValueError(f"{self.name}: {self.refusal(len(history), bucket_s)}")
        sigma = _residual_sigma(history[m:] - history[:-m])
        return _SeasonalFit(last_season=history[-m:].copy(), sigma1=sigma)


@dataclass(frozen=True)
class _BlendFit(Fitted):
    level: float
    yesterday: np.ndarray  # the final day of history
    weight_of_lead: np.ndarray  # weight on the recent level per lead, length m
    sigma_level: float
    sigma_season: float

    def predict(self, horizon: int, interval: float = 0.8) -> Prediction:
        m = len(self.yesterday)
        h = np.arange(horizon)
        w = self.weight_of_lead[np.minimum(h, m - 1)]
        yhat = w * self.level + (1 - w) * self.yesterday[h % m]
        # Sum of the two components' sigmas: an upper bound on the sd of a weighted sum of
        # correlated errors, so the interval is conservative rather than too narrow.
        sigma = w * self.sigma_level * np.sqrt(h + 1) + (1 - w) * self.sigma_season
        return normal_prediction(yhat, sigma, interval)


class SeasonalBlend(SeasonalNaive):
    """Recent level (mean of the last `level_window_s`) blended with the same bucket a day
    earlier, the level's weight decaying as exp(-lead / `tau_s`): persistence for the next
    minutes, yesterday's shape for the hours after. A past-only predictor; `tau_s` is fixed, not
    fitted."""

    name = "seasonal_blend"
    level_window_s = 1800
    tau_s = 3 * 3600

    def fit(self, history: np.ndarray, *, bucket_s: int, end: float) -> Fitted:
        m = season_length(bucket_s, self.period_s)
        if m is None or len(history) <= m:
            raise ValueError(f"{self.name}: {self.refusal(len(history), bucket_s)}")
        k = max(1, self.level_window_s // bucket_s)
        lead_s = (np.arange(m) + 1) * bucket_s
        return _BlendFit(
            level=float(np.mean(history[-k:])),
            yesterday=history[-m:].copy(),
            weight_of_lead=np.exp(-lead_s / self.tau_s),
            sigma_level=_residual_sigma(np.diff(history)),
            sigma_season=_residual_sigma(history[m:] - history[:-m]),
        )
