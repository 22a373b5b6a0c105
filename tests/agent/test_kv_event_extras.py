"""Blocks that differ only in what is not their tokens (cache salt, LoRA adapter, KV-cache group,
multimodal input) get distinct canonical keys, from payloads vLLM's own event classes encoded
(tests/fixtures/kv_events/make_vllm_fixtures.py; the vllm-marked test below re-encodes them with
the installed vLLM and compares)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import msgpack
import pytest

from harness.realvllm.engine import EngineUnavailable, vllm_python
from nodeagent.engine_residency import EngineResidency
from nodeagent.kvevents import BlockStored, decode_payload, normalise
from tests.realvllm.conftest import unavailable
from wire import blockhash

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv_events"
VLLM = FIXTURES / "vllm-0.32.0-extra.msgpack"
SGLANG = FIXTURES / "sglang-0.5.23.msgpack"  # make_sglang_fixtures.py
BS = 32
TOKENS = list(range(100, 100 + 2 * BS))


def cases(path: Path = VLLM) -> dict[str, bytes]:
    return msgpack.unpackb(path.read_bytes())["cases"]


def keys_of(*names: str, path: Path = VLLM) -> dict[str, list[int]]:
    """Each case applied to one engine's residency, in order: the canonical keys it stored."""
    res = EngineResidency("vllm-0", BS)
    out = {}
    for name in names:
        res.apply_events(decode_payload(cases(path)[name])[1])
        entry = res.take_entry(hex_keys=False)
        out[name] = [row[0] for row in entry["stored"]] if entry else []
    return out


def test_plain_blocks_keep_their_keys():
    assert keys_of("plain")["plain"] == blockhash.chain_keys(TOKENS, BS)


def test_salt_adapter_group_and_media_give_distinct_keys():
    got = keys_of("plain", "salted", "salted_other", "lora_a", "lora_b", "group_1", "mm")
    firsts = [k[0] for k in got.values()]
    seconds = [k[1] for k in got.values()]
    assert len(set(firsts)) == len(got) and len(set(seconds)) == len(got), got
    # The same keys a request tap computes for the same request (salt on the first block only).
    assert got["salted"] == blockhash.request_keys(TOKENS, BS, cache_salt="salt-a")
    assert got["lora_a"] == blockhash.request_keys(TOKENS, BS, lora_name="adapter-a")


def test_a_group_is_kept_apart_even_under_the_same_engine_hashes():
    res = EngineResidency("vllm-0", BS)
    for name in ("plain", "group_1"):  # both publish engine hashes 11 and 12
        res.apply_events(decode_payload(cases()[name])[1])
    assert res.block_count() == 4
    res.take_entry()
    res.apply_events(decode_payload(cases()["removed_group_1"])[1])
    entry = res.take_entry(hex_keys=False)
    assert res.block_count() == 3 and 12 in res.resident_hashes()
    assert [r[0] for r in entry["removed"]] == [keys_of("group_1")["group_1"][1]]


def test_every_field_is_decoded():
    raw = decode_payload(cases()["group_1"])[1][0]
    ev = normalise(raw)
    assert isinstance(ev, BlockStored)
    assert (ev.group_idx, ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window) == (
        1,
        "sliding_window",
        128,
    )
    assert normalise(decode_payload(cases()["lora_a"])[1][0]).extra_keys == [
        ["adapter-a"],
        ["adapter-a"],
    ]


@pytest.mark.vllm
def test_fixture_is_what_vllm_encodes(tmp_path):
    try:
        python = vllm_python()
    except EngineUnavailable as exc:
        unavailable(str(exc))  # a skip here, a failure under CI=true
    out = tmp_path / "again.msgpack"
    subprocess.run(
        [str(python), str(FIXTURES / "make_vllm_fixtures.py"), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert cases(out) == cases()


def test_sglang_publisher_decodes_like_vllm():
    """SGLang 0.5.23's own classes: plain blocks key as vLLM's do, its cache_salt and adapter
    key apart, its CPU_PINNED medium lands in the CPU tier, removals and clears apply."""
    got = keys_of("plain", "salted", "lora_a", path=SGLANG)
    assert got["plain"] == keys_of("plain")["plain"] == blockhash.chain_keys(TOKENS, BS)
    assert got["salted"] == blockhash.request_keys(TOKENS, BS, cache_salt="salt-a")
    assert got["lora_a"] == blockhash.request_keys(TOKENS, BS, lora_name="adapter-a")
    res = EngineResidency("sglang-0", BS)
    for name in ("plain", "cpu_pinned"):
        res.apply_events(decode_payload(cases(SGLANG)[name])[1])
    assert res.resident_hashes("CPU") == {71, 72} and res.resident_hashes("GPU") == {11, 12}
    res.apply_events(decode_payload(cases(SGLANG)["removed"])[1])
    assert res.block_count() == 3
    res.apply_events(decode_payload(cases(SGLANG)["cleared"])[1])
    assert res.block_count() == 0
