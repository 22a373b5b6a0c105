"""The speculable-miss rule (controlplane/core/misses.py), worked by hand."""

from controlplane.core import misses as m


def test_bursts_are_twice_the_median_bucket_and_at_least_three():
    assert m.burst_starts([1, 1, 1, 6, 1]) == [False, False, False, True, False]
    assert m.burst_starts([0, 0, 2, 0]) == [False, False, False, False]  # under 3 requests
    assert m.burst_starts([]) == []


def test_cold_misses_in_a_burst_or_the_lead_before_it_are_speculable():
    requests = [1, 1, 1, 6, 1]  # the burst is bucket 3
    cold = [0, 2, 1, 1, 1]
    # lead 2 buckets: buckets 1, 2 (before) and 3 (the burst) count; bucket 4 (after) does not.
    assert m.speculable(cold, requests, lead_buckets=2) == 4
    assert m.speculable(cold, requests, lead_buckets=0) == 1  # only the burst's own bucket
