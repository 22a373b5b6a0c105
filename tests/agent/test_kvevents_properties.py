"""Property tests: whatever bytes or msgpack a KV-event publisher sends, the decoder and the
residency tracker either apply it or raise EventDecodeError (a lost message -> resync), never
another exception that would take the subscriber down."""

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.engine_residency import EngineResidency
from nodeagent.kvevents import (
    CLEARED,
    REMOVED,
    STORED,
    EventDecodeError,
    decode_payload,
    decode_seq,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what msgpack can carry
scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
tags = st.sampled_from([STORED, REMOVED, CLEARED, "Other", 3, None])
hashes = st.lists(
    st.one_of(ints, st.binary(max_size=10), st.text(max_size=3), st.none()), max_size=4
)
tokens = st.one_of(
    st.none(),
    st.lists(
        st.one_of(st.integers(min_value=-5, max_value=2**33), st.text(max_size=2)), max_size=40
    ),
    values,
)
positional = (
    st.tuples(
        tags,
        st.one_of(hashes, values),
        st.one_of(ints, st.binary(max_size=9), values),
        tokens,
        st.one_of(st.integers(min_value=-2, max_value=64), values),
        st.one_of(st.none(), ints, values),
        st.one_of(st.text(max_size=4), values),
        st.one_of(st.none(), st.text(max_size=4), values),
    )
    .map(list)
    .flatmap(lambda ev: st.integers(min_value=1, max_value=len(ev)).map(lambda n: ev[:n]))
)
mapped = st.fixed_dictionaries(
    {"type": tags},
    optional={
        "block_hashes": st.one_of(hashes, values),
        "parent_block_hash": st.one_of(ints, values),
        "token_ids": tokens,
        "block_size": st.one_of(st.integers(min_value=-2, max_value=64), values),
        "lora_id": st.one_of(st.none(), ints, values),
        "medium": st.one_of(st.text(max_size=4), values),
        "lora_name": st.one_of(st.none(), st.text(max_size=4), values),
    },
)
events = st.lists(st.one_of(positional, mapped, values), max_size=6)


def _apply(payload: bytes) -> None:
    _, raw_events, _ = decode_payload(payload)
    EngineResidency("vllm-0", 4).apply_events(raw_events)


@FAST
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_the_defined_error(payload):
    try:
        _apply(payload)
    except EventDecodeError:
        pass


@FAST
@given(st.binary(max_size=12))
def test_sequence_frame_is_eight_bytes_or_the_defined_error(frame):
    try:
        assert decode_seq(frame) == int.from_bytes(frame, "big", signed=True)
    except EventDecodeError:
        assert len(frame) != 8


@FAST
@given(
    st.one_of(st.floats(allow_nan=False), ints, values), events, st.one_of(st.none(), ints, values)
)
def test_arbitrary_event_batches_apply_or_raise_the_defined_error(ts, evs, rank):
    payload = msgpack.packb([ts, evs, rank], use_bin_type=True)
    try:
        _apply(payload)
    except EventDecodeError:
        pass


@FAST
@given(values)
def test_any_msgpack_value_is_a_batch_or_the_defined_error(value):
    try:
        _apply(msgpack.packb(value, use_bin_type=True))
    except EventDecodeError:
        pass


def test_a_bytes_parent_hash_of_blocks_without_tokens_is_keyed_not_a_crash():
    """Newer vLLM publishes bytes hashes; a stored batch without its token ids is keyed for its
    engine alone, its parent included (found by the property test above)."""
    payload = msgpack.packb(
        [0.0, [[STORED, [b"\x01" * 8], b"\x02" * 8, None, 4, None, "GPU"]], None],
        use_bin_type=True,
    )
    _apply(payload)
