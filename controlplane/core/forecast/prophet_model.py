"""Prophet (Taylor & Letham 2018) as a `Forecaster`, made cheap enough for 1,000 keys.

Speed choices, each measured in `bench/forecast.py`:
- Fitted on hourly sums (`FIT_BUCKET_S`) when the key's buckets are finer: Prophet models the
  day-scale shape, which hourly points carry, and Stan's fit time grows with the points (a
  14-day history is 336 points instead of 2,016). The hourly forecast is divided back into
  buckets and linearly interpolated between hour midpoints.
- `uncertainty_samples=0`: no Monte-Carlo trend simulation. The interval is analytic instead:
  yhat +- z * sigma with sigma the RMS of the in-sample residuals at the key's own bucket size
  (Prophet's interval is dominated by that noise term at hour-to-day leads anyway).
- Prophet's fit is the cost; its `predict` is mostly pandas overhead, paid once in `fit` (for
  the residuals) and once per `predict`.

Daily seasonality is used from `MIN_HISTORY_S` (2 days, two full cycles), weekly only from
`WEEKLY_MIN_HISTORY_S` (14 days, Prophet's own automatic rule), yearly never. cmdstanpy and
prophet log at INFO for every fit; they are silenced here.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from controlplane.core.forecast.baselines import Fitted, Forecaster, Prediction, normal_prediction
from controlplane.core.forecast.series import DAY_S, WEEK_S, aggregate, describe_duration

MIN_HISTORY_S = 2 * DAY_S
WEEKLY_MIN_HISTORY_S = 2 * WEEK_S
FIT_BUCKET_S = 3600


def _silence_stan_logging() -> None:
    for name in ("cmdstanpy", "prophet", "prophet.plot"):
        logger = logging.getLogger(name)
        # A handler of our own stops cmdstanpy's lazy get_logger() from adding its INFO one.
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())
        logger.setLevel(logging.ERROR)
        logger.propagate = False


@contextmanager
def _quiet_pandas() -> Iterator[None]:
    # Prophet 1.5 calls pandas APIs that pandas 3.1 deprecates; the warnings are Prophet's.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        yield


@dataclass(frozen=True)
class _ProphetFit(Fitted):
    model: object
    end: float
    bucket_s: int
    fit_s: int
    sigma: float

    def predict(self, horizon: int, interval: float = 0.8) -> Prediction:
        factor = self.fit_s // self.bucket_s
        values = self.fit_values(-(-horizon // factor) + 1)  # one extra to interpolate the last
        yhat = interpolate_fit(values, self.end, self.fit_s, self.bucket_s, self.end, horizon)
        return normal_prediction(yhat, np.full(horizon, self.sigma), interval)

    def fit_values(self, n_fit: int) -> np.ndarray:
        """Prophet's expected count per fit bucket (an hour) for the ``n_fit`` after ``end``: what
        the forecast tick stores and reads back (``interpolate_fit``) instead of refitting."""
        import pandas as pd

        fit_starts = self.end + np.arange(n_fit) * self.fit_s
        future = pd.DataFrame({"ds": pd.to_datetime(fit_starts, unit="s")})
        with _quiet_pandas():
            return self.model.predict(future)["yhat"].to_numpy()  # type: ignore[attr-defined]


def interpolate_fit(
    values: np.ndarray,
    fit_end: float,
    fit_s: int,
    bucket_s: int,
    start: float,
    horizon: int,
) -> np.ndarray:
    """Expected count per bucket for the ``horizon`` buckets from ``start`` out of per-fit-bucket
    values starting at ``fit_end``: linear between fit-bucket midpoints, scaled to the bucket."""
    factor = fit_s / bucket_s
    mids = fit_end + (np.arange(len(values)) + 0.5) * fit_s
    bucket_mids = start + (np.arange(horizon) + 0.5) * bucket_s
    return np.interp(bucket_mids, mids, np.asarray(values, dtype=np.float64)) / factor


class ProphetForecaster(Forecaster):
    """Prophet with daily (and, from 14 days, weekly) seasonality; refuses < 2 days of history."""

    name = "prophet"

    def min_history(self, bucket_s: int) -> int:
        return -(-MIN_HISTORY_S // bucket_s)

    def refusal(self, n_buckets: int, bucket_s: int) -> str | None:
        if n_buckets >= self.min_history(bucket_s):
            return None
        have = describe_duration(n_buckets * bucket_s)
        need = describe_duration(MIN_HISTORY_S)
        return f"only {have} of history: baselines only, Prophet needs >= {need}"

    def fit(self, history: np.ndarray, *, bucket_s: int, end: float) -> Fitted:
        import pandas as pd

        refusal = self.refusal(len(history), bucket_s)
        if refusal:
            raise ValueError(refusal)
        _silence_stan_logging()
        from prophet import Prophet

        fit_s = bucket_s
        if bucket_s < FIT_BUCKET_S and FIT_BUCKET_S % bucket_s == 0:
            fit_s = FIT_BUCKET_S
        factor = fit_s // bucket_s
        y_fit = aggregate(history, factor)
        starts = end - (len(y_fit) - np.arange(len(y_fit))) * fit_s
        span_s = len(history) * bucket_s
        model = Prophet(
            uncertainty_samples=0,
            daily_seasonality=span_s >= MIN_HISTORY_S,
            weekly_seasonality=span_s >= WEEKLY_MIN_HISTORY_S,
            yearly_seasonality=False,
        )
        ds = pd.to_datetime(starts, unit="s")
        with _quiet_pandas():
            model.fit(pd.DataFrame({"ds": ds, "y": y_fit}))
            in_sample = model.predict(pd.DataFrame({"ds": ds}))["yhat"].to_numpy()
        # Residuals at the key's own bucket size: interpolate the hourly fit to bucket midpoints.
        used = history[len(history) - len(y_fit) * factor :]
        bucket_mids = end - (len(used) - np.arange(len(used)) - 0.5) * bucket_s
        fitted = np.interp(bucket_mids, starts + fit_s / 2, in_sample) / factor
        sigma = float(np.sqrt(np.mean((used - fitted) ** 2)))
        return _ProphetFit(model, float(end), bucket_s, fit_s, sigma)
