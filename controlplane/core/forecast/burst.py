"""Short-horizon burst risk: the chance that a key's arrivals outrun its holders' capacity.

Model. Arrivals of a key are a stationary renewal process with rate r (requests/s) and
inter-arrival coefficient of variation c (ServeGen fits Gamma or Weibull inter-arrival times per
10-minute window; c = 1 is Poisson, c > 1 bursty). By the renewal central limit theorem (Cox,
*Renewal Theory*, 1962, ch. 6) the count N in a horizon of H seconds has

    E[N] = r H,        Var[N] ~ r H c^2.

The rate itself is only known from the last W seconds of arrivals (`window_s`); its estimate has
variance r c^2 / W by the same theorem, which adds (H^2) r c^2 / W to Var[N] (the predictive
variance given an estimated rate). So

    mu = r H,          sigma^2 = r H c^2 (1 + H / W).

For over-dispersed counts (sigma^2 > mu, the bursty case) N is taken as negative binomial (a
Gamma-mixed Poisson) with that mean and variance, which keeps the right skew and the mass at zero
that short horizons of bursty keys have; otherwise (c < 1) as Normal with a continuity correction.
The risk is P(N > K) with K = capacity_rate x H, the requests the current holders can serve in
the horizon. Tests check it against Monte-Carlo Gamma and Weibull renewal processes with
parameters of real ServeGen windows.
"""

from __future__ import annotations

import math

import numpy as np

#: Above this threshold the negative binomial sum is replaced by its Normal limit (the error
#: is far below the model's own), keeping one risk evaluation at microseconds to ~1 ms.
# A burst is this many times a key's rate (recent or forecast, the larger); the planner's demand
# model (core/demand.py) and the array path read it from here.
BURST_FACTOR = 2.0
_NEGBIN_MAX_TERMS = 50_000


def count_moments(
    recent_rate: float, interarrival_cv: float, horizon_s: float, window_s: float
) -> tuple[float, float]:
    """Mean and variance of the arrivals in the horizon (see the module docstring)."""
    mu = recent_rate * horizon_s
    parameter_term = horizon_s / window_s if math.isfinite(window_s) else 0.0
    return mu, mu * interarrival_cv**2 * (1 + parameter_term)


def _negbin_sf(k: int, mu: float, var: float) -> float:
    """P(N > k) for a negative binomial with mean mu and variance var > mu."""
    size = mu * mu / (var - mu)
    p = size / (size + mu)  # success probability in scipy's nbinom(size, p) parametrisation
    j = np.arange(1, k + 1, dtype=np.float64)
    # log pmf(j) = log pmf(j-1) + log((j - 1 + size) / j) + log(1 - p)
    log_pmf = size * math.log(p) + np.concatenate(
        ([0.0], np.cumsum(np.log((j - 1 + size) / j) + math.log1p(-p)))
    )
    cdf = float(np.exp(log_pmf).sum())
    return min(1.0, max(0.0, 1.0 - cdf))


def _normal_sf(k: int, mu: float, var: float) -> float:
    if var <= 0:
        return 1.0 if mu > k else 0.0
    return 0.5 * math.erfc((k + 0.5 - mu) / math.sqrt(2 * var))


def burst_risk(
    *,
    recent_rate: float,
    interarrival_cv: float,
    capacity_rate: float,
    horizon_s: float,
    window_s: float = 60.0,
) -> float:
    """P(arrivals within `horizon_s` exceed `capacity_rate` x `horizon_s`), in [0, 1].

    `recent_rate` (req/s) and `interarrival_cv` are measured over the last `window_s` seconds;
    `window_s=inf` treats the rate as known exactly. Formula and assumptions: module docstring.
    """
    values = dict(
        recent_rate=recent_rate,
        interarrival_cv=interarrival_cv,
        capacity_rate=capacity_rate,
        horizon_s=horizon_s,
    )
    for name, value in values.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not (window_s > 0):
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    mu, var = count_moments(recent_rate, interarrival_cv, horizon_s, window_s)
    if mu == 0:
        return 0.0
    k = math.floor(capacity_rate * horizon_s)
    if var > mu * (1 + 1e-9) and k <= _NEGBIN_MAX_TERMS:
        return _negbin_sf(k, mu, var)
    return _normal_sf(k, mu, var)


class BurstTracker:
    """Online rate, inter-arrival CV and burst risk of one key from its arrival timestamps.

    Exponentially decaying statistics with time constant `window_s`: O(1) memory and work per
    arrival. The rate is the decayed count over the decayed exposure since `start` (or since the
    first arrival), so it is unbiased for a steady rate from the first seconds on. The CV comes
    from decayed first and second moments of the gaps between arrivals (n arrivals at one
    timestamp add n - 1 zero gaps); with fewer than two gaps it is 1, the Poisson value.
    """

    def __init__(self, window_s: float = 60.0, start: float | None = None) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._start = start
        self._last: float | None = None
        self._count = 0.0  # decayed arrivals, as of self._last
        self._gap_w = self._gap_s1 = self._gap_s2 = 0.0  # decayed gap weight, sum, sum of squares

    def observe(self, t: float, n: int = 1) -> None:
        """Record `n` arrivals at time `t` (seconds; never earlier than the previous one)."""
        if not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if not math.isfinite(t):
            raise ValueError(f"t must be finite, got {t!r}")
        if self._last is None:
            if self._start is not None and t < self._start:
                raise ValueError(f"arrival at {t} before the tracker's start {self._start}")
            self._start = t if self._start is None else self._start
            self._count = float(n)
            self._gap_w = float(n - 1)  # simultaneous arrivals: zero gaps
        else:
            if t < self._last:
                raise ValueError(f"arrivals must come in time order: {t} < {self._last}")
            decay = math.exp(-(t - self._last) / self.window_s)
            gap = t - self._last
            self._count = self._count * decay + n
            self._gap_w = self._gap_w * decay + n
            self._gap_s1 = self._gap_s1 * decay + gap
            self._gap_s2 = self._gap_s2 * decay + gap * gap
        self._last = t

    def _check_now(self, now: float) -> None:
        if self._last is not None and now < self._last:
            raise ValueError(f"now={now} is before the last observed arrival {self._last}")

    def exposure(self, now: float) -> float:
        """Decayed observation time behind the rate estimate (<= window_s)."""
        self._check_now(now)
        if self._start is None:
            return 0.0
        return self.window_s * -math.expm1(-(now - self._start) / self.window_s)

    def rate(self, now: float) -> float:
        """Recent arrival rate (requests/s) as of `now`."""
        exposure = self.exposure(now)
        if self._last is None or exposure <= 0:
            return 0.0
        return self._count * math.exp(-(now - self._last) / self.window_s) / exposure

    def cv(self, now: float) -> float:
        """Recent coefficient of variation of inter-arrival times (1.0 with < 2 gaps)."""
        self._check_now(now)
        if self._gap_w < 2:
            return 1.0
        mean = self._gap_s1 / self._gap_w
        if mean <= 0:  # every arrival at one instant: no spread to measure, assume Poisson
            return 1.0
        var = max(self._gap_s2 / self._gap_w - mean * mean, 0.0)
        return math.sqrt(var) / mean

    def risk(self, now: float, capacity_rate: float, horizon_s: float) -> float:
        """`burst_risk` from this key's recent rate and CV, over its effective window."""
        exposure = self.exposure(now)
        if exposure <= 0:
            return 0.0
        return burst_risk(
            recent_rate=self.rate(now),
            interarrival_cv=self.cv(now),
            capacity_rate=capacity_rate,
            horizon_s=horizon_s,
            window_s=exposure,
        )
