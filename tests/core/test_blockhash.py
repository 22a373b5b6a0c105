"""Properties of the canonical chained block hash (what gateways rely on)."""

from hypothesis import given
from hypothesis import strategies as st

from wire import blockhash as bh

tokens = st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=16, max_size=96)


@given(tokens)
def test_same_tokens_same_keys(toks):
    assert bh.chain_keys(toks, 16) == bh.chain_keys(list(toks), 16)


@given(tokens, st.data())
def test_changing_a_block_changes_it_and_every_later_key(toks, data):
    keys = bh.chain_keys(toks, 16)
    pos = data.draw(st.integers(min_value=0, max_value=len(keys) * 16 - 1))
    changed = list(toks)
    changed[pos] = (changed[pos] + 1) % 2**32
    other = bh.chain_keys(changed, 16)
    block = pos // 16
    assert other[:block] == keys[:block]
    assert all(a != b for a, b in zip(other[block:], keys[block:], strict=True))


def test_partial_block_has_no_key_and_block_size_matters():
    toks = list(range(40))
    assert len(bh.chain_keys(toks, 16)) == 2
    assert bh.chain_keys(toks, 8)[0] != bh.chain_keys(toks, 16)[0]


def test_extra_keys_separate_lora_adapters():
    toks = list(range(16))
    assert bh.chain_keys(toks, 16, bh.extra_for("a")) != bh.chain_keys(toks, 16)
    assert bh.chain_keys(toks, 16, bh.extra_for("a")) != bh.chain_keys(toks, 16, bh.extra_for("b"))


def test_published_vector_is_stable():
    # Gateways that reimplement the function check themselves against this vector.
    assert bh.to_hex(bh.chain_keys(list(range(16)), 16)[0]) == "e89df0ab1f53b782"


def test_hex_round_trip_and_errors():
    assert bh.from_hex(bh.to_hex(2**64 - 1)) == 2**64 - 1
    for bad in ["", "xyz", "1" * 17, None]:
        try:
            bh.from_hex(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_token_out_of_range_is_a_clear_error():
    try:
        bh.block_key(0, [-1] * 16)
    except ValueError as exc:
        assert "token ids" in str(exc)
    else:
        raise AssertionError("negative token accepted")


@given(
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=48),
    st.integers(min_value=-3, max_value=20),
    st.text(max_size=6),
)
def test_any_input_gives_64_bit_keys_or_a_value_error(toks, block_size, lora):
    # Gateways send arbitrary token ids: the hash answers or refuses clearly, never anything else.
    try:
        keys = bh.chain_keys(toks, block_size, bh.extra_for(lora))
    except ValueError:
        assert block_size <= 0 or any(not 0 <= t < 2**32 for t in toks)
        return
    assert len(keys) == (len(toks) // block_size)
    assert all(0 <= k < 2**64 and bh.from_hex(bh.to_hex(k)) == k for k in keys)


@given(tokens, st.text(min_size=1, max_size=8))
def test_a_lora_name_changes_every_key(toks, lora):
    assert all(
        a != b
        for a, b in zip(
            bh.chain_keys(toks, 16), bh.chain_keys(toks, 16, bh.extra_for(lora)), strict=True
        )
    )
