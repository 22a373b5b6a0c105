"""One behaviour suite for both residency index implementations."""

import os

import pytest

from controlplane.core.residency_index import Delta, Holder, InProcessResidencyIndex

REDIS_URL = os.environ.get("PREWARM_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _redis_index():
    redis = pytest.importorskip("redis")
    from controlplane.core.residency_redis import RedisResidencyIndex

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("Redis is not running (make test-services starts it)")
    index = RedisResidencyIndex(client, namespace="pwtest")
    index.clear()
    return index


@pytest.fixture(params=["inprocess", pytest.param("redis", marks=pytest.mark.services)])
def index(request):
    idx = InProcessResidencyIndex() if request.param == "inprocess" else _redis_index()
    yield idx
    idx.clear()


A, B, C, D = 0xA, 0xB, 0xC, 0xFFFF_FFFF_FFFF_FFF0  # the last one needs all 64 bits


def test_longest_prefix_ranks_deepest_first(index):
    index.apply([Delta(1, stored=[(A, None, "GPU"), (B, A, "GPU"), (C, B, "GPU")])])
    index.apply([Delta(2, stored=[(A, None, "GPU"), (B, A, "CPU")])])
    index.apply([Delta(3, stored=[(B, A, "GPU"), (C, B, "GPU")])])  # lacks the root: depth 0
    assert index.holders([A, B, C]) == [Holder(1, 3, "GPU"), Holder(2, 2, "CPU")]
    assert index.holders([D]) == []


def test_removed_and_cleared_blocks_stop_counting(index):
    index.apply([Delta(1, stored=[(A, None, "GPU"), (B, A, "GPU")])])
    index.apply([Delta(1, removed=[(B, "GPU")])])
    assert index.holders([A, B]) == [Holder(1, 1, "GPU")]
    index.apply([Delta(1, cleared=True, stored=[(D, None, "GPU")])])
    assert index.holders([A]) == []
    assert index.engines_of(D) == {1: "GPU"}


def test_snapshot_replaces_engine_and_usage_counts_media(index):
    index.apply([Delta(7, stored=[(A, None, "GPU"), (B, A, "GPU")])])
    index.apply(
        [Delta(7, snapshot=True, stored=[(C, None, "GPU"), (C, None, "CPU"), (D, C, "DISK")])]
    )
    assert index.blocks_of(7) == {C: "GPU", D: "DISK"}
    assert index.usage(7).blocks == {"GPU": 1, "CPU": 1, "DISK": 1}
    assert index.usage(7).total == 3
    assert index.parent_of(D) == C
    assert index.engines() == [7]


def test_removing_one_tier_keeps_the_other(index):
    index.apply([Delta(1, stored=[(A, None, "GPU"), (A, None, "CPU")])])
    index.apply([Delta(1, removed=[(A, "GPU")])])
    assert index.engines_of(A) == {1: "CPU"}


def test_unknown_medium_is_refused_and_changes_nothing(index):
    with pytest.raises(ValueError, match="unknown medium"):
        index.apply([Delta(1, stored=[(A, None, "GPU")]), Delta(2, stored=[(B, None, "HBM9")])])
    assert index.engines() == []


def test_drop_engine_forgets_it(index):
    index.apply([Delta(1, stored=[(A, None, "GPU")]), Delta(2, stored=[(A, None, "GPU")])])
    index.drop_engine(1)
    assert index.engines_of(A) == {2: "GPU"}
    assert index.engines() == [2]


def test_mark_live_says_once_that_the_index_is_new_or_was_lost(index):
    assert index.mark_live() is True  # new: every engine must send a snapshot
    assert index.mark_live() is False
    index.apply([Delta(1, stored=[(A, None, "GPU")])])
    index.clear()  # what a Redis restarted without persistence looks like
    assert index.mark_live() is True


def test_holders_many_answers_like_holders_for_each_chain(index):
    index.apply(
        [
            Delta(1, stored=[(A, None, "GPU"), (B, A, "GPU")]),
            Delta(2, stored=[(A, None, "CPU")]),
            Delta(3, stored=[(C, None, "GPU")]),
        ]
    )
    chains = [[A, B], [A], [C, A], [B], []]
    assert index.holders_many(chains, limit=4) == [index.holders(c, limit=4) for c in chains]
    assert [[(h.engine, h.depth) for h in hs] for hs in index.holders_many(chains)][:2] == [
        [(1, 2), (2, 1)],
        [(1, 1), (2, 1)],
    ]


def test_full_holders_many_is_holders_at_full_depth(index):
    index.apply(
        [
            Delta(1, stored=[(A, None, "GPU"), (B, A, "CPU"), (C, B, "GPU")]),
            Delta(2, stored=[(A, None, "GPU"), (B, A, "GPU"), (C, B, "DISK")]),
            Delta(3, stored=[(B, A, "GPU"), (C, B, "GPU")]),  # lacks the root
            Delta(4, stored=[(A, None, "GPU"), (B, A, "GPU"), (C, B, "GPU")]),
            Delta(5, stored=[(A, None, "GPU"), (C, B, "GPU")]),
        ]
    )  # a hole in the middle
    chains = [[A, B, C], [A, B], [A], [B, C], [C], [D], []]
    expected = [[h for h in index.holders(c, limit=8) if h.depth == len(c)] for c in chains]
    assert index.full_holders_many(chains, limit=8) == expected
    assert expected[0] == [Holder(4, 3, "GPU"), Holder(1, 3, "CPU"), Holder(2, 3, "DISK")]
    assert index.full_holders_many(chains, limit=2)[0] == expected[0][:2]


@pytest.mark.services
def test_redis_matches_inprocess_under_random_churn():
    """Duplicated keys, store and remove of one key in the same delta, parents set after a root
    and more keys than one multi-field call carries: Redis ends where the in-process index does."""
    import random

    redis_idx, ref = _redis_index(), InProcessResidencyIndex()
    rng = random.Random(3)
    pool = [rng.getrandbits(64) for _ in range(1500)]
    media = ["GPU", "CPU", "DISK"]
    for step in range(6):
        deltas = []
        for engine in (1, 2, 3):
            stored = [
                (rng.choice(pool), rng.choice([None, rng.choice(pool)]), rng.choice(media))
                for _ in range(rng.randrange(0, 2500))
            ]
            removed = [(rng.choice(pool), rng.choice(media)) for _ in range(rng.randrange(0, 2500))]
            deltas.append(
                Delta(engine, stored=stored, removed=removed, snapshot=step == 3 and engine == 2)
            )
        assert redis_idx.apply(deltas) == ref.apply(deltas)
    try:
        for engine in (1, 2, 3):
            assert redis_idx.blocks_of(engine) == ref.blocks_of(engine)
            assert redis_idx.usage(engine) == ref.usage(engine)
        for key in pool[:300]:
            assert redis_idx.engines_of(key) == ref.engines_of(key)
            assert redis_idx.parent_of(key) == ref.parent_of(key)
    finally:
        redis_idx.clear()


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def _with_clock(index, clock, window, cap):
    index.clock, index.removal_window_s, index.removal_cap = clock, window, cap
    return index


def test_removals_are_kept_for_the_window_and_bounded_per_engine(index):
    clock = Clock()
    idx = _with_clock(index, clock, window=60.0, cap=3)
    idx.apply([Delta(1, stored=[(k, None, "GPU") for k in (A, B, C, D)])])
    assert idx.removed_at_many([(1, A)]) == [None]  # stored, never removed
    idx.apply([Delta(1, removed=[(A, "GPU")])])
    clock.now = 1010.0
    # Removing what the engine never held, or a medium it does not hold, is no removal.
    idx.apply([Delta(1, removed=[(B, "GPU"), (0x77, "GPU")]), Delta(2, removed=[(C, "GPU")])])
    assert idx.removed_at_many([(1, A), (1, B), (1, 0x77), (2, C), (1, C)]) == [
        1000.0,
        1010.0,
        None,
        None,
        None,
    ]
    # Stored again: the removal stays on record (a request that missed it re-stored it).
    idx.apply([Delta(1, stored=[(A, None, "GPU")])])
    assert idx.removed_at_many([(1, A)]) == [1000.0]
    # At most `cap` per engine: the oldest goes first.
    clock.now = 1020.0
    idx.apply([Delta(1, removed=[(C, "GPU"), (D, "GPU")])])
    assert idx.removed_at_many([(1, A), (1, B), (1, C), (1, D)]) == [None, 1010.0, 1020.0, 1020.0]
    # Past the window nothing counts.
    clock.now = 1071.0
    assert idx.removed_at_many([(1, B), (1, C)]) == [None, 1020.0]
    clock.now = 1081.0
    assert idx.removed_at_many([(1, C), (1, D)]) == [None, None]


def test_a_block_left_on_another_medium_is_not_removed(index):
    idx = _with_clock(index, Clock(), window=60.0, cap=10)
    idx.apply([Delta(1, stored=[(A, None, "GPU"), (A, None, "CPU")])])
    idx.apply([Delta(1, removed=[(A, "GPU")])])
    assert idx.removed_at_many([(1, A)]) == [None]
    idx.apply([Delta(1, removed=[(A, "CPU")])])
    assert idx.removed_at_many([(1, A)]) == [1000.0]


def _parents(index) -> int:
    if isinstance(index, InProcessResidencyIndex):
        return len(index._parent)
    return index.r.hlen(f"{index.ns}:p")


def test_a_block_that_left_every_engine_takes_its_parent_along(index):
    """Every request's own blocks are new keys: stored, then evicted. The parent map keeps the
    keys some engine holds, not every key ever seen (it grew for as long as the process ran)."""
    index.apply([Delta(1, stored=[(A, None, "GPU")]), Delta(2, stored=[(A, None, "GPU")])])
    sizes = []
    for n in range(60):
        own = [(n + 1) << 16 | i for i in range(1, 33)]
        rows = [(k, p, "GPU") for p, k in zip([A, *own[:-1]], own, strict=True)]
        index.apply([Delta(1 + n % 2, stored=rows)])
        index.apply([Delta(1 + n % 2, removed=[(k, "GPU") for k in own])])
        # Stored and removed within one delta (a report between two evictions) leaves nothing.
        index.apply([Delta(2, stored=rows, removed=[(k, "GPU") for k in own])])
        sizes.append(_parents(index))
    assert sizes == [1] * 60  # A (a root, held by both engines)
    # A block another engine still holds keeps its parent.
    index.apply([Delta(1, stored=[(B, A, "GPU")]), Delta(2, stored=[(B, A, "GPU")])])
    index.apply([Delta(1, removed=[(B, "GPU")])])
    assert index.parent_of(B) == A
    index.apply([Delta(2, cleared=True)])
    assert index.parent_of(B) is None and index.engines_of(B) == {}  # a clear drops it too
