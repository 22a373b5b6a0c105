"""Prefill, KV-size and transfer arithmetic against hand-computed cases."""

import math

import pytest

from controlplane.core.costmodel import CostModel, transfer_s


def test_kv_bytes_per_token_from_model_shape():
    # 2 (K,V) * 80 layers * 8 KV heads * 128 dims * 2 bytes = 327,680 (~320 KB/token).
    assert CostModel.preset("llama3-70b", "h100").kv_bytes_per_token == 327_680
    assert CostModel.preset("llama3-8b", "h100").kv_bytes_per_token == 131_072


def test_prefill_seconds_hand_computed():
    c = CostModel.preset("llama3-8b", "h100", gpus=1)
    # 1000 new tokens, nothing cached: dense 2*8.03e9*1000 = 1.606e13 FLOPs;
    # attention 4*32*4096*1000*500 = 2.62144e11; at 0.5 * 989e12 FLOP/s plus 20 ms.
    expected = 0.02 + (1.606e13 + 2.62144e11) / (0.5 * 989e12)
    assert c.prefill_s(1000) == pytest.approx(expected, rel=1e-12)
    # Cached context only adds attention: 4*32*4096*1000*4000 more FLOPs.
    more = 4 * 32 * 4096 * 1000 * 4000 / (0.5 * 989e12)
    assert c.prefill_s(1000, 4000) == pytest.approx(expected + more, rel=1e-12)


def test_batch_pays_overhead_once():
    c = CostModel.preset("llama3-8b", "a800", gpus=1)
    one = c.prefill_s(500)
    assert c.batch_prefill_s([(500, 0), (500, 0)]) == pytest.approx(2 * one - 0.02)


def test_transfer_and_bad_input():
    assert transfer_s(25e9, 12.5e9, 0.005) == pytest.approx(2.005)
    assert math.isinf(transfer_s(1, 0))
    with pytest.raises(ValueError):
        CostModel.preset("llama3-70b", "h100", gpus=1)  # 141 GB of weights on 80 GB
    with pytest.raises(ValueError):
        CostModel.preset("gpt-9", "h100")


def test_default_capacity_leaves_weights_out():
    c = CostModel.preset("llama3-70b", "h100")
    assert c.gpus == 4
    assert c.default_kv_capacity_bytes() == pytest.approx(4 * 80e9 * 0.85 - 70.6e9 * 2)
