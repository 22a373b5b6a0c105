"""Engine-local LRU prefix cache: matching, eviction order, speculative blocks."""

import pytest

from controlplane.core.prefix_cache import PrefixCache


def test_match_counts_leading_blocks():
    c = PrefixCache(10)
    c.use([1, 2, 3], 0.0)
    assert c.match([1, 2, 3, 4]) == 3
    # A key names its block with the whole chain before it (keys are chained hashes), so a held
    # key matches wherever it stands: [2, 3] is two cached blocks, not a miss at the root.
    assert c.match([2, 3]) == 2
    assert c.match([9, 2, 3]) == 0  # the match is leading: a miss at the root ends it
    assert c.match([9, 1]) == 0


def test_lru_evicts_least_recent_leaves_first():
    c = PrefixCache(4)
    c.use([1, 2, 3], 0.0)
    c.use([7], 1.0)
    evicted = c.use([8], 2.0)  # over capacity by one: the leaf 3 goes, not its parent 1
    assert evicted == [3]
    assert c.match([1, 2, 3]) == 2


def test_speculative_never_evicts_referenced_blocks():
    c = PrefixCache(4)
    c.use([1, 2, 3], 0.0)
    c.busy_since = 0.0  # the request that used them is still queued or running
    assert c.place([10, 11], 1.0, replica_id=1, speculative=True) == 0  # only one block free
    assert c.place([10], 1.0, replica_id=2, speculative=True) == 1
    assert len(c.spec) == 1 and c.match([1, 2, 3]) == 3


def test_speculative_takes_unreferenced_blocks_cheapest_first():
    c = PrefixCache(6)
    c.use([1, 2, 3], 0.0)  # a valuable prefix
    c.use([7, 8], 1.0)  # a cold one, used more recently
    c.use([9], 5.0)  # still in use
    c.busy_since = 5.0
    value = {1: 1.0, 2: 1.0, 3: 1.0, 20: 5.0, 21: 5.0}.get  # 20, 21: a replica for a burst
    assert c.free == 0 and c.spec_room(lambda k: value(k, 0.0)) == 5  # all but the one in use
    assert c.place([20, 21], 6.0, 1, True, value_of=lambda k: value(k, 0.0)) == 2
    assert 7 not in c and 8 not in c and c.match([1, 2, 3]) == 3 and 9 in c
    # Displacing the valuable prefix needs a replica worth more than it.
    assert c.place([30], 6.0, 2, True, value_of=lambda k: value(k, 0.0), budget=0.5) == 0
    assert c.place([30], 6.0, 3, True, value_of=lambda k: value(k, 0.0), budget=2.0) == 1
    assert 3 not in c and c.match([1, 2, 3]) == 2  # the leaf went first
    fit, lost = c.displaceable(2, lambda k: value(k, 0.0))
    assert fit == 2 and lost >= 0


def test_pinned_blocks_are_kept_while_others_can_go():
    c = PrefixCache(4)
    c.use([1, 2], 0.0)
    c.use([5, 6], 1.0)
    c.pin([1, 2], until=100.0)
    assert c.use([7], 2.0) == [6]  # LRU would take 2 (the leaf of 1-2): the lease keeps it
    assert c.match([1, 2]) == 2
    c.unpin_expired(200.0)
    assert not c.pinned


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
    c.busy_since = 4.0  # blocks used by requests still queued: not displaceable
    c.use([40], 4.0)
    c.blocks.update({k: 4.0 for k in c.blocks})
    assert c.spec_room() == 0  # full of referenced blocks: no room to speculate
