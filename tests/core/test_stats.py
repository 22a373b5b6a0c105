"""controlplane/core/stats.py against scipy.stats on random samples."""

import random

import pytest
import scipy.stats as scipy_stats

from controlplane.core import stats

TOL = 1e-9


def _samples(rng: random.Random, n: int) -> list[float]:
    scale = rng.choice((0.01, 1.0, 300.0))
    return [rng.lognormvariate(0, 1) * scale for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_t_distribution_matches_scipy(seed):
    rng = random.Random(seed)
    df = rng.choice((1, 2, 3, 4.5, 9, 17.3, 60, 400))
    q = rng.uniform(0.5005, 0.9995)
    assert stats.t_ppf(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), abs=TOL, rel=TOL)
    x = rng.uniform(-8, 8)
    assert stats.t_cdf(x, df) == pytest.approx(scipy_stats.t.cdf(x, df), abs=TOL)


@pytest.mark.parametrize("seed", range(20))
def test_welch_and_paired_intervals_match_scipy(seed):
    rng = random.Random(seed)
    a, b = _samples(rng, rng.randint(2, 40)), _samples(rng, rng.randint(2, 40))
    got = stats.welch(a, b)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (got.low, got.high) == pytest.approx((ref.low, ref.high), abs=TOL, rel=TOL)
    b2 = _samples(rng, len(a))
    got = stats.paired(a, b2)
    ref = scipy_stats.ttest_rel(a, b2).confidence_interval(0.95)
    assert (got.low, got.high) == pytest.approx((ref.low, ref.high), abs=TOL, rel=TOL)
    one = stats.mean_interval(a, level=0.9)
    ref = scipy_stats.ttest_1samp(a, 0).confidence_interval(0.9)
    assert (one.low, one.high) == pytest.approx((ref.low, ref.high), abs=TOL, rel=TOL)


def test_ratio_mean_weights_requests_not_clusters():
    # Two clusters: 1 request at 1.0 s, 9 requests at 0.1 s each: per request 0.19 s, not the
    # clusters' mean of means 0.55 s.
    m = stats.ratio_mean([1.0, 0.9, 0.5], [1, 9, 5])
    assert m.estimate == pytest.approx(2.4 / 15)
    # Clusters of equal size: the ratio estimator is the mean of the cluster means with its
    # sample standard error (scipy's).
    rng = random.Random(3)
    means = _samples(rng, 12)
    eq = stats.ratio_mean([x * 4 for x in means], [4] * 12)
    assert eq.estimate == pytest.approx(sum(means) / 12, rel=TOL)
    assert eq.se == pytest.approx(scipy_stats.sem(means), rel=TOL)


def test_required_n_reaches_the_power_scipy_computes():
    rng = random.Random(7)
    for _ in range(10):
        effect, sd_a, sd_b = rng.uniform(0.05, 1), rng.uniform(0.2, 1), rng.uniform(0.2, 1)
        n = stats.required_n(effect, sd_a, sd_b)
        assert n is not None and n >= 2

        def exact(k, effect=effect, sd_a=sd_a, sd_b=sd_b):  # noncentral t power, k a side
            se = ((sd_a**2 + sd_b**2) / k) ** 0.5
            df = (sd_a**2 / k + sd_b**2 / k) ** 2 / ((sd_a**4 + sd_b**4) / k**2 / (k - 1))
            crit = scipy_stats.t.ppf(0.975, df)
            nc = effect / se
            return scipy_stats.nct.sf(crit, df, nc) + scipy_stats.nct.cdf(-crit, df, nc)

        assert exact(n) >= 0.79
        if n > 2:
            assert exact(n - 1) < 0.81
    assert stats.required_n(0.0, 1.0, 1.0) is None


def test_bootstrap_percentile_interval_agrees_with_scipy():
    rng = random.Random(11)
    xs = _samples(rng, 30)
    got, empty = stats.bootstrap(xs, lambda s: sum(s) / len(s), draws=4000, seed=1)
    ref = scipy_stats.bootstrap(
        (xs,),
        lambda s: sum(s) / len(s),
        vectorized=False,
        method="percentile",
        n_resamples=4000,
        rng=1,
    ).confidence_interval
    assert empty == 0
    spread = ref.high - ref.low
    # Two Monte Carlo draws of the same interval: endpoints agree within a few percent of it.
    assert got.low == pytest.approx(ref.low, abs=0.08 * spread)
    assert got.high == pytest.approx(ref.high, abs=0.08 * spread)
    none, left_out = stats.bootstrap([1.0, 2.0], lambda s: None, draws=10)
    assert none is None and left_out == 10
