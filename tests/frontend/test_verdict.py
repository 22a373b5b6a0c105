"""The scoreboard's verdict on realistic fleets (engines reporting real block sizes): the
cluster's own scored replicas first, the simulator's map as the prior, and which one it used."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.demand.models import WorkloadKey
from controlplane.fleet.models import Engine, Node
from controlplane.replication import scoreboard as sb
from controlplane.replication.models import SpeculativeReplica

KV_70B = 327_680  # bytes per token, Llama-3-70B (80 layers x 8 KV heads x 128 x 2 x fp16)
KV_8B = 131_072


def _map(*cells):
    doc = {"burst_onset_s": 60.0, "noise": {"p99": 0.05, "mean": 0.05}, "cells": []}
    for ratio, load, gain, noise in cells:
        doc["cells"].append(
            {
                "copy_to_onset": ratio,
                "load": load,
                "predictive_gain_p99": gain,
                "predictive_gain_mean": gain / 2,
                "oracle_gain_p99": gain,
                "oracle_gain_mean": gain / 2,
                "predictive_gain_p99_noise": noise,
                "predictive_gain_mean_noise": noise,
            }
        )
    return doc


MAP = _map(
    (0.001, 0.5, 0.0, 0.01),  # fast copies: nothing to gain -> reactive-enough
    (1.0, 0.5, 0.30, 0.10),
)  # copies as slow as a burst's onset -> speculate


@pytest.fixture
def fleet(db, settings, monkeypatch):
    monkeypatch.setattr(sb, "load_map", lambda: MAP)
    settings.PREWARM_LINK_BYTES_PER_S = 1.25e9  # 10 Gb/s between nodes

    def make(kv_per_token, prefix_tokens, engines=4, load=0.5):
        node = Node.objects.create(name=f"n{kv_per_token}")
        out = [
            Engine.objects.create(
                node=node,
                engine_id=f"e{i}",
                block_size=16,
                bytes_per_block=16 * kv_per_token,
                metrics={"kv_usage": load},
            )
            for i in range(engines)
        ]
        key = WorkloadKey.objects.create(
            tenant="acme", model="m", prefix_group="*", prefix_tokens=prefix_tokens
        )
        return out, key, prefix_tokens * kv_per_token

    return make


def place(engine, key, n, nbytes, hits, saved_per_hit, shadow=False):
    now = timezone.now()
    for _ in range(n):
        SpeculativeReplica.objects.create(
            engine=engine,
            workload_key=key,
            prefix_keys=["01"],
            bytes=nbytes,
            shadow=shadow,
            bytes_moved=0 if shadow else nbytes,  # what the executor reported moving
            forecaster="ewma",
            placed_at=now - timedelta(hours=1),
            expires_at=now,
            hits=hits,
            ttft_saved_s=saved_per_hit * hits,
            vram_byte_seconds=1.0,
            scored_at=now,
        )


def test_slow_copies_used_replicas_speculation_pays(fleet):
    # 70B, 100k-token prefixes (33 GB) over 10 Gb/s at load 0.5: a copy takes ~52 s, as long as
    # a burst's onset; 27 of 30 replicas were used, each saving 5 x 10 s of prefill.
    engines, key, nbytes = fleet(KV_70B, 100_000)
    place(engines[0], key, 27, nbytes, hits=5, saved_per_hit=10.0)
    place(engines[1], key, 3, nbytes, hits=0, saved_per_hit=0.0)
    rec = sb.scoreboard()["recommendation"]
    assert rec["verdict"] == "speculation_pays" and rec["basis"] == "own scores and map"
    assert rec["prior"] == "speculation_pays" and rec["tenants_that_benefit"] == ["acme"]


def test_fast_copies_reactive_is_enough(fleet):
    # 8B, 4k-token prefixes (0.5 GB): a copy lands in ~1 s; the replicas were used, but a
    # reactive copy made when demand turned hot would have done as well.
    engines, key, nbytes = fleet(KV_8B, 4096)
    place(engines[0], key, 25, nbytes, hits=4, saved_per_hit=0.3, shadow=True)
    rec = sb.scoreboard()["recommendation"]
    assert rec["verdict"] == "reactive_enough" and rec["basis"] == "own scores and map"
    assert rec["prior"] == "reactive_enough"


def test_unused_replicas_costing_link_time_avoid(fleet):
    # Slow copies (the map's prior says speculate) but 1 of 25 replicas used: 25 x 26 s of
    # link time for 10 s of prefill saved. The cluster's own scores win over the prior.
    engines, key, nbytes = fleet(KV_70B, 100_000)
    place(engines[0], key, 1, nbytes, hits=1, saved_per_hit=10.0)
    place(engines[1], key, 24, nbytes, hits=0, saved_per_hit=0.0)
    rec = sb.scoreboard()["recommendation"]
    assert rec["verdict"] == "avoid" and rec["basis"] == "own scores"
    assert rec["prior"] == "speculation_pays"


def test_too_few_scores_give_the_maps_prior(fleet):
    engines, key, nbytes = fleet(KV_70B, 100_000)
    place(engines[0], key, 3, nbytes, hits=5, saved_per_hit=10.0)
    rec = sb.scoreboard()["recommendation"]
    assert rec["verdict"] == "insufficient_data" and rec["basis"] == "map"
    assert rec["prior"] == "speculation_pays" and "prior is the simulator's map" in rec["text"]


def test_the_map_says_avoid_and_the_scores_do_not_overturn_it(fleet, monkeypatch):
    monkeypatch.setattr(sb, "load_map", lambda: _map((1.0, 0.5, -0.3, 0.1)))
    engines, key, nbytes = fleet(KV_70B, 100_000)
    place(engines[0], key, 10, nbytes, hits=1, saved_per_hit=1.0)
    place(engines[1], key, 10, nbytes, hits=0, saved_per_hit=0.0)
    rec = sb.scoreboard()["recommendation"]
    # Half used but saving 10 s for 260 s of link time: not "pays"; not clear waste either
    # (precision above the floor); the map's prior decides.
    assert rec["verdict"] == "avoid" and rec["basis"] == "own scores and map"


def test_an_uncertain_map_cell_leaves_the_verdict_to_the_scores(fleet, monkeypatch):
    # The map's cell says reactive-enough, but only for want of seeds (+20% +- 50%): no
    # evidence either way, so the used, slow-to-copy replicas decide.
    monkeypatch.setattr(sb, "load_map", lambda: _map((1.0, 0.5, 0.20, 0.50)))
    engines, key, nbytes = fleet(KV_70B, 100_000)
    place(engines[0], key, 27, nbytes, hits=5, saved_per_hit=10.0)
    rec = sb.scoreboard()["recommendation"]
    assert rec["verdict"] == "speculation_pays" and rec["basis"] == "own scores"
    assert rec["prior"] == "uncertain"


def test_the_bundled_map_separates_the_demo_presets(fleet):
    # The committed map: short prefixes on fast links are firmly "reactive is enough"; long
    # 70B prefixes are not settled by the map (the scores decide).
    from controlplane.sim.speculation_map import load_map

    doc = load_map()
    fast = sb._prior(sb.advice(0.001, 0.3, doc))
    slow = sb._prior(sb.advice(0.03, 0.3, doc))
    assert fast == "reactive_enough" and slow in ("uncertain", "speculation_pays")
