"""The scoreboard's verdict from evidence: gateways' records and agents' reports through the API,
scoring and the verdict unpatched. Each verdict arises from data; the map is a prior only where
the cluster can be placed on it (these engines report no GPU, so it cannot)."""

import pytest

from controlplane.replication.tasks import score_replicas
from tests.workflow.conftest import eager, fleet  # noqa: F401 - the fixtures
from tests.workflow.evidence import (
    TOKENS,
    Evidence,
    confirmed_copy,
    held_out_pair,
    prefix,
    set_holdout,
    since,
)

PAIRS = 10  # PREWARM_HOLDOUT_MIN_ASSIGNMENTS: assignments on each arm


@pytest.fixture
def ev(fleet):  # noqa: F811
    e = Evidence(fleet)
    e.report("node-a", [k for i in range(2 * PAIRS) for k in prefix(i)])
    return e


def verdict(fleet):  # noqa: F811
    score_replicas.delay()
    return fleet.operator.get(f"/api/scoreboard/?since={since()}").json()


def holdout_run(ev, fleet, held_out_ttft):  # noqa: F811
    """PAIRS prefixes copied to node-b (treated), PAIRS others held out on node-c; each prefix
    serves three requests: treated ones hit on node-b in ~0.2 s, held-out ones go to node-c
    cold and take ``held_out_ttft(j)``."""
    policy = fleet.policy("manual", holdout_fraction=0.0)
    treated = [ev.key(i) for i in range(PAIRS)]
    held = [ev.key(PAIRS + i) for i in range(PAIRS)]
    for key in treated:
        confirmed_copy(ev, policy, key, "node-b")
    set_holdout(fleet, policy, 1.0)
    for key in held:
        held_out_pair(ev, policy, key, "node-c")
    for i, (t, h) in enumerate(zip(treated, held, strict=True)):
        ev.served(t, "node-b", 3, cached=TOKENS, ttft_s=lambda j, i=i: 0.2 + 0.01 * ((i + j) % 3))
        ev.served(h, "node-c", 3, cached=0, ttft_s=lambda j, i=i: held_out_ttft(i + j))
    return verdict(fleet)


def test_too_little_evidence_is_insufficient_data_and_no_map_prior(ev, fleet):  # noqa: F811
    confirmed_copy(ev, fleet.policy("manual", holdout_fraction=0.0), ev.key(0), "node-b")
    rec = verdict(fleet)["recommendation"]
    assert rec["verdict"] == "insufficient_data" and rec["basis"] == "none"
    assert rec["prior"] is None and rec["holdout_assignments"] == 0
    assert "cannot be placed on the simulator's map" in rec["text"]
    assert "its engines report no GPU" in rec["text"]


def test_measured_uplift_beyond_the_cost_says_speculation_pays(ev, fleet):  # noqa: F811
    board = holdout_run(ev, fleet, lambda j: 1.5 + 0.05 * (j % 3))
    rec, ho = board["recommendation"], board["holdout"]
    assert rec["verdict"] == "speculation_pays" and rec["basis"] == "holdout"
    assert rec["holdout_assignments"] == PAIRS
    assert f"{PAIRS} treated and held-out assignments" in rec["text"]
    diff = ho["ttft_diff_s"]
    assert diff["high"] < 0 and diff["low"] < diff["diff"] < diff["high"]
    assert ho["treated"]["hit_rate"] == 1.0 and ho["held_out"]["hit_rate"] == 0.0
    assert {t["tenant"] for t in ho["by_tenant"]} == {f"tenant-{i}" for i in range(2 * PAIRS)}


def test_no_measured_uplift_says_reactive_is_enough(ev, fleet):  # noqa: F811
    board = holdout_run(ev, fleet, lambda j: 0.2 + 0.01 * ((j + 1) % 3))
    rec, diff = board["recommendation"], board["holdout"]["ttft_diff_s"]
    assert diff["low"] < 0 < diff["high"]  # the interval spans no effect
    assert rec["verdict"] == "reactive_enough" and rec["basis"] == "holdout"


def test_copies_that_cost_more_link_time_than_they_saved_say_avoid(ev, fleet, settings):  # noqa: F811
    settings.PREWARM_LINK_BYTES_PER_S = 1e6  # 4 MiB copies take ~4 s each
    settings.PREWARM_SCOREBOARD_MIN_REPLICAS = 4
    policy = fleet.policy("manual", holdout_fraction=0.0)
    for i in range(2):
        key = ev.key(i)
        confirmed_copy(ev, policy, key, "node-b")
        confirmed_copy(ev, policy, key, "node-c")
    ev.served(ev.key(0), "node-b", 1, cached=TOKENS, ttft_s=0.2)  # one replica used once
    board = verdict(fleet)
    rec = board["recommendation"]
    assert board["totals"]["cost_s"] > 16 and board["totals"]["ttft_saved_s"] < 1
    assert rec["verdict"] == "avoid" and rec["basis"] == "own scores"
