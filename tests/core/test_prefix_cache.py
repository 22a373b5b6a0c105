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


def test_speculative_slice_is_bounded_and_evicted_first():
    c = PrefixCache(10)
    c.spec_limit = 3
    assert c.spec_room() == 3
    assert c.place([10, 11, 12, 13], 0.0, replica_id=1, speculative=True) == 0  # over the slice
    assert c.place([10, 11], 0.0, replica_id=1, speculative=True) == 2
    assert c.place([20, 21], 1.0, replica_id=2, speculative=True) == 2  # drops replica 1's leaf
    assert len(c.spec) == 3 and 11 not in c and 10 in c
    c.use([1, 2, 3, 4, 5, 6], 2.0)  # fills the free blocks: 9 of 10 used
    evicted = c.use([7, 8], 3.0)  # one over: a speculative block goes, not block 1 (LRU)
    assert evicted == [10] and c.match([1, 2, 3, 4, 5, 6]) == 6
    # An on-demand copy also takes speculative blocks before normal ones.
    c.place([30, 31], 4.0, replica_id=3, speculative=False)
    assert 20 not in c and 21 not in c and c.match([1, 2, 3, 4, 5, 6, 7, 8]) == 8
    assert c.spec_room() == 0  # full of normal blocks: no room to speculate
