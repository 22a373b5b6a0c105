"""Rolling-origin backtests: refit at successive origins on the key's own history, score MASE.

With `folds` = k and horizon H, the origins are n - H, n - 2H, ..., n - kH (non-overlapping test
blocks, newest last); a fold is kept only where the forecaster accepts the history before its
origin. Each fold's MASE is scaled on that fold's own training history.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.core.forecast.baselines import Forecaster
from controlplane.core.forecast.series import mase


@dataclass(frozen=True)
class BacktestScore:
    """MASE of one forecaster per fold, keyed by the fold's origin (bucket index)."""

    model: str
    fold_mase: dict[int, float]

    @property
    def mean(self) -> float:
        return float(np.mean(list(self.fold_mase.values())))

    def mean_over(self, origins: set[int]) -> float:
        """Mean MASE over the given origins only (to compare on the folds two models share)."""
        return float(np.mean([self.fold_mase[o] for o in sorted(origins)]))


def fold_origins(n: int, horizon: int, folds: int, min_history: int) -> list[int]:
    """Origins (bucket indices) of the folds that fit in a history of `n`, oldest first."""
    origins = [n - horizon * k for k in range(folds, 0, -1)]
    # Two history points at least: MASE needs a lag-1 difference to scale by.
    return [o for o in origins if o >= max(min_history, 2)]


def backtest(
    counts: np.ndarray,
    forecaster: Forecaster,
    *,
    bucket_s: int,
    end: float,
    horizon: int,
    folds: int,
) -> BacktestScore | None:
    """Rolling-origin backtest of `forecaster`; None when no fold fits in the history."""
    n = len(counts)
    origins = fold_origins(n, horizon, folds, forecaster.min_history(bucket_s))
    if not origins:
        return None
    scores: dict[int, float] = {}
    for origin in origins:
        history = counts[:origin]
        fitted = forecaster.fit(history, bucket_s=bucket_s, end=end - (n - origin) * bucket_s)
        prediction = fitted.predict(horizon)
        scores[origin] = mase(counts[origin : origin + horizon], prediction.yhat, history)
    return BacktestScore(model=forecaster.name, fold_mase=scores)
