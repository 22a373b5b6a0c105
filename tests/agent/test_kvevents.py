"""vLLM KV events (both encodings, real messages) -> residency with canonical keys."""

import msgpack
import pytest

from nodeagent.engine_residency import FLAG_ENGINE_SCOPED, EngineResidency
from nodeagent.kvevents import EventDecodeError, decode_payload, decode_seq
from tests.agent.conftest import VERSIONS, load_messages
from wire.blockhash import ROOT_PARENT, block_key, engine_scoped_key, to_hex


def apply_all(frames):
    res = EngineResidency("vllm-0", 16)
    for _topic, seq, payload in frames:
        decode_seq(seq)
        _, events, _ = decode_payload(payload)
        res.apply_events(events)
    return res


def canonical(expected, h):
    """Canonical key from the expected file's tokens, or None when an ancestor is not in it
    (the file lists resident blocks only; an evicted ancestor's tokens are not there)."""
    if str(h) not in expected["parent_of"]:
        return None
    parent = expected["parent_of"][str(h)]
    p = ROOT_PARENT if parent is None else canonical(expected, parent)
    return None if p is None else block_key(p, expected["token_ids_of"][str(h)])


def checkable(expected):
    hs = [h for h in expected["resident_after_all"] if canonical(expected, h) is not None]
    assert len(hs) > len(expected["resident_after_all"]) // 2
    return hs


@pytest.mark.parametrize("version", VERSIONS)
def test_real_messages_end_with_expected_residency(version):
    frames, expected = load_messages(version)
    res = apply_all(frames)
    assert res.resident_hashes() == set(expected["resident_after_all"])
    assert res.resident_hashes("GPU") == set(expected["resident_after_all"])
    snap = res.take_entry(force_snapshot=True)
    assert len(snap["stored"]) == len(expected["resident_after_all"])
    want = {to_hex(canonical(expected, h)) for h in checkable(expected)}
    assert want <= {row[0] for row in snap["stored"]}
    for _key, _parent, medium, flags in snap["stored"]:
        assert medium == "GPU" and flags == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_parents_are_canonical(version):
    frames, expected = load_messages(version)
    snap = apply_all(frames).take_entry(force_snapshot=True)
    by_key = {row[0]: row[1] for row in snap["stored"]}
    for h in checkable(expected):
        parent = expected["parent_of"][str(h)]
        want = None if parent is None else to_hex(canonical(expected, parent))
        assert by_key[to_hex(canonical(expected, h))] == want


def test_both_encodings_give_identical_reports():
    a = apply_all(load_messages("0.10.1")[0]).take_entry(force_snapshot=True)
    b = apply_all(load_messages("0.33.0")[0]).take_entry(force_snapshot=True)
    assert sorted(a["stored"]) == sorted(b["stored"])


def test_deltas_are_net_and_cleared_is_reported():
    frames, _ = load_messages("0.33.0")
    res = EngineResidency("vllm-0", 16)
    res.take_entry()  # initial snapshot
    for _t, _s, payload in frames[:31]:  # the AllBlocksCleared is in message 30
        res.apply_events(decode_payload(payload)[1])
    entry = res.take_entry()
    assert entry["mode"] == "delta" and entry["cleared"] is True
    stored = {r[0] for r in entry["stored"]}
    assert not stored & {r[0] for r in entry["removed"]}
    assert res.take_entry() is None  # nothing new


def test_missing_token_ids_fall_back_to_engine_scoped_keys():
    res = EngineResidency("vllm-0", 16)
    res.apply_events(
        [
            {
                "type": "BlockStored",
                "block_hashes": [11, 12],
                "parent_block_hash": None,
                "token_ids": None,
                "block_size": 16,
                "medium": "CPU",
            }
        ]
    )
    snap = res.take_entry(force_snapshot=True)
    rows = sorted(snap["stored"])
    assert {r[0] for r in rows} == {
        to_hex(engine_scoped_key("vllm-0", 11)),
        to_hex(engine_scoped_key("vllm-0", 12)),
    }
    assert all(r[2] == "CPU" and r[3] & FLAG_ENGINE_SCOPED for r in rows)


def test_batched_store_splits_tokens_per_block():
    tokens = list(range(48))
    res = EngineResidency("e", 16)
    res.apply_events([["BlockStored", [1, 2, 3], None, tokens, 16, None]])
    k1 = block_key(ROOT_PARENT, tokens[:16])
    k2 = block_key(k1, tokens[16:32])
    k3 = block_key(k2, tokens[32:])
    snap = res.take_entry(force_snapshot=True)
    assert sorted(snap["stored"]) == sorted(
        [
            [to_hex(k1), None, "GPU", 0],
            [to_hex(k2), to_hex(k1), "GPU", 0],
            [to_hex(k3), to_hex(k2), "GPU", 0],
        ]
    )


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1])])
def test_malformed_payload_is_a_clear_error(payload):
    with pytest.raises(EventDecodeError):
        decode_payload(payload)


def test_unknown_event_tag_is_rejected():
    res = EngineResidency("e", 16)
    with pytest.raises(EventDecodeError):
        res.apply_events([["BlockMoved", [1]]])
