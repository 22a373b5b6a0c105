"""Engine-local LRU prefix cache: matching, eviction order, speculative blocks."""

import pytest

from controlplane.core.prefix_cache import PrefixCache


def test_match_counts_leading_blocks():
    c = PrefixCache(10)
    c.use([1, 2, 3], 0.0)
    assert c.match([1, 2, 3, 4]) == 3
    assert c.match([2, 3]) == 0 or c.match([2, 3]) == 2  # keys are chained: 2 alone is a prefix key
    assert c.match([9, 1]) == 0


def test_lru_evicts_least_recent_leaves_first():
    c = PrefixCache(4)
    c.use([1, 2, 3], 0.0)
    c.use([7], 1.0)
    evicted = c.use([8], 2.0)  # over capacity by one: the leaf 3 goes, not its parent 1
    assert evicted == [3]
    assert c.match([1, 2, 3]) == 2


def test_speculative_never_evicts_normal_blocks():
    c = PrefixCache(4)
    c.use([1, 2, 3], 0.0)
    assert c.place([10, 11], 1.0, replica_id=1, speculative=True) == 0  # only one block free
    assert c.place([10], 1.0, replica_id=2, speculative=True) == 1
    assert len(c.spec) == 1 and c.match([1, 2, 3]) == 3


def test_speculative_use_counts_as_hit_and_ttl_expires():
    c = PrefixCache(8)
    c.place([10, 11], 0.0, replica_id=1, speculative=True, expires_at=100.0)
    c.place([20], 0.0, replica_id=2, speculative=True, expires_at=50.0)
    c.use([10, 11, 12], 10.0)
    assert c.replica_used == {1: True, 2: False}
    assert c.expire(60.0) == 1 and 20 not in c
    c.finish(60.0)
    # Three speculative blocks for 10 s, then one until it expired at 60 s.
    assert c.spec_block_seconds == pytest.approx(3 * 10 + 1 * 50)


def test_bad_capacity():
    with pytest.raises(ValueError):
        PrefixCache(0)
