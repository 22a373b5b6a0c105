"""The statistics every comparison uses: Student t intervals (one sample, paired, Welch), a
cluster ratio mean, a percentile bootstrap and the sample size a difference needs.

One implementation for the simulator's seed tables (``sim/seeds.py``), the real A/B bench
(``bench/real_ab.py``) and the scoreboard's holdout (``replication/holdout.py``), so the three
say the same thing about the same numbers. Pure Python (the t distribution through the
regularized incomplete beta function); ``tests/core/test_stats.py`` checks it against
``scipy.stats``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

LEVEL = 0.95
POWER = 0.8


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided interval: ``estimate`` in [``low``, ``high``] at
    ``level``, from a standard error ``se`` on ``df`` degrees of freedom (None: bootstrap)."""

    estimate: float
    low: float
    high: float
    se: float | None
    df: float | None
    level: float = LEVEL

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict:
        return asdict(self)


# -- the t distribution ------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
    ln += b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t on ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def _t_pdf(t: float, df: float) -> float:
    ln = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(ln - (df + 1) / 2 * math.log1p(t * t / df))


def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t on ``df`` degrees of freedom (Newton from the normal
    quantile, bracketed)."""
    if not 0.0 < q < 1.0:
        raise ValueError("q must be in (0, 1)")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, hi * 2
    x = min(max(statistics.NormalDist().inv_cdf(q), lo), hi)
    for _ in range(200):
        f = t_cdf(x, df) - q
        if f > 0:
            hi = x
        else:
            lo = x
        step = f / _t_pdf(x, df)
        nxt = x - step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - x) <= 1e-14 * max(1.0, abs(x)):
            return nxt
        x = nxt
    return x


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided ``level`` quantile: an interval is estimate +- this x its standard error."""
    return t_ppf(0.5 + level / 2, df)


# -- intervals ---------------------------------------------------------------------------------
def _interval(estimate: float, se: float, df: float, level: float) -> Interval:
    half = t_quantile(df, level) * se
    return Interval(estimate, estimate - half, estimate + half, se, df, level)


def mean_interval(xs: Sequence[float], level: float = LEVEL) -> Interval | None:
    """The mean of ``xs`` with its Student t interval; None below two values."""
    n = len(xs)
    if n < 2:
        return None
    return _interval(statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(n), n - 1, level)


def paired(base: Sequence[float], other: Sequence[float], level: float = LEVEL) -> Interval | None:
    """Mean of the paired differences ``base - other`` with its t interval (None below two
    pairs)."""
    if len(base) != len(other):
        raise ValueError("paired samples need the same length")
    return mean_interval([b - o for b, o in zip(base, other, strict=True)], level)


@dataclass(frozen=True)
class Mean:
    """One arm's estimate: a mean, its standard error and the degrees of freedom behind it."""

    estimate: float
    se: float
    df: float
    n: int


def sample_mean(xs: Sequence[float]) -> Mean | None:
    n = len(xs)
    if n < 2:
        return None
    return Mean(statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(n), n - 1, n)


def ratio_mean(sums: Sequence[float], counts: Sequence[float]) -> Mean | None:
    """The per-item mean over clusters, ``sum(sums) / sum(counts)`` (each cluster's items
    weighted alike, not each cluster), with its cluster-robust standard error (the linearized
    ratio estimator: residuals ``sums_i - R counts_i`` over the mean count), on ``clusters - 1``
    degrees of freedom. Clusters of equal size give ``sample_mean`` of their means."""
    units = [(s, c) for s, c in zip(sums, counts, strict=True) if c > 0]
    n = len(units)
    if n < 2:
        return None
    total = sum(c for _, c in units)
    r = sum(s for s, _ in units) / total
    mbar = total / n
    resid = [s - r * c for s, c in units]
    var = sum(e * e for e in resid) / (n - 1) / (n * mbar * mbar)
    return Mean(r, math.sqrt(var), n - 1, n)


def difference(a: Mean | None, b: Mean | None, level: float = LEVEL) -> Interval | None:
    """``a - b`` of two independent estimates with the Welch-Satterthwaite t interval."""
    if a is None or b is None:
        return None
    va, vb = a.se**2, b.se**2
    se = math.sqrt(va + vb)
    if se == 0:
        d = a.estimate - b.estimate
        return Interval(d, d, d, 0.0, None, level)
    df = (va + vb) ** 2 / (va**2 / a.df + vb**2 / b.df)
    return _interval(a.estimate - b.estimate, se, df, level)


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval | None:
    """mean(a) - mean(b) with Welch's t interval; None below two values on either side."""
    return difference(sample_mean(a), sample_mean(b), level)


def bootstrap(
    samples: Sequence,
    statistic: Callable[[list], float | None],
    draws: int = 2000,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[Interval | None, int]:
    """``statistic(samples)`` with a percentile bootstrap interval: ``samples`` (whole units,
    e.g. seeds with all their arms) resampled with replacement ``draws`` times. A resample
    where the statistic is undefined (None) is left out and counted: returns (interval or
    None, resamples left out)."""
    point = statistic(list(samples))
    rng = random.Random(seed)
    n = len(samples)
    values, empty = [], 0
    for _ in range(draws):
        v = statistic([samples[rng.randrange(n)] for _ in range(n)])
        if v is None:
            empty += 1
        else:
            values.append(v)
    if point is None or not values:
        return None, empty
    values.sort()
    lo, hi = quantile(values, (1 - level) / 2), quantile(values, (1 + level) / 2)
    return Interval(point, lo, hi, None, None, level), empty


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, linear between order statistics (numpy's default)."""
    pos = q * (len(sorted_xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(sorted_xs) - 1)
    return sorted_xs[i] + (sorted_xs[j] - sorted_xs[i]) * (pos - i)


# -- how many more -----------------------------------------------------------------------------
def power(effect: float, sd_a: float, sd_b: float, n: int, level: float = LEVEL) -> float:
    """The chance that a two-sided Welch interval on ``n`` units a side excludes zero when the
    true difference is ``effect`` (units' standard deviations ``sd_a``, ``sd_b``; the shifted
    central t approximation of the noncentral t)."""
    if n < 2:
        return 0.0
    va, vb = sd_a**2 / n, sd_b**2 / n
    se = math.sqrt(va + vb)
    if se == 0:
        return 1.0 if effect else 0.0
    df = (va + vb) ** 2 / ((va**2 + vb**2) / (n - 1))
    crit = t_quantile(df, level)
    shift = abs(effect) / se
    return (1.0 - t_cdf(crit - shift, df)) + t_cdf(-crit - shift, df)


def required_n(
    effect: float,
    sd_a: float,
    sd_b: float,
    level: float = LEVEL,
    target: float = POWER,
    cap: int = 1_000_000,
) -> int | None:
    """Units a side for a Welch interval to exclude zero with probability ``target`` if the
    true difference is ``effect``; None where no sample up to ``cap`` would (no effect)."""
    if effect == 0 or not math.isfinite(effect):
        return None
    lo, hi = 2, 2
    while power(effect, sd_a, sd_b, hi, level) < target:
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if power(effect, sd_a, sd_b, mid, level) >= target:
            hi = mid
        else:
            lo = mid + 1
    return hi


def pairs_needed(diffs: Sequence[float], level: float = LEVEL, target: float = POWER) -> int | None:
    """Pairs a paired t interval would need to exclude zero with probability ``target`` if the
    true mean difference and the spread of the differences were those measured in ``diffs``
    (``required_n`` with the differences as one arm: their own standard deviation, on
    pairs - 1 degrees of freedom); None below two pairs or with no difference to resolve."""
    if len(diffs) < 2:
        return None
    return required_n(statistics.fmean(diffs), statistics.stdev(diffs), 0.0, level, target)
