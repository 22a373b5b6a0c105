"""Scoreboard figures from a run through the API: copies approved, landed and confirmed by their
engines' KV events, requests served from gateways' records, scoring run, nothing set by hand."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.harness import burst
from controlplane.replication.plans.costs import cost_model_for, prefill_s
from controlplane.replication.scoreboard import scoreboard
from controlplane.replication.tasks import score_replicas
from tests.workflow.conftest import BYTES_PER_BLOCK, eager, fleet  # noqa: F401
from tests.workflow.evidence import BLOCKS, TOKENS, Evidence, confirmed_copy, prefix, since

M_KEYS = {
    "replicas",
    "hits",
    "hits_basis",
    "hits_measured_replicas",
    "precision",
    "bytes_moved",
    "vram_byte_seconds",
    "host_byte_seconds",
    "ttft_saved_s",
    "saving_basis",
    "cost_s",
}


@pytest.fixture
def board(fleet, settings):  # noqa: F811
    """Three confirmed copies (two tenants); tenant-0's copy on node-b serves 6 hits."""
    ev = Evidence(fleet)
    ev.report("node-a", [k for i in range(2) for k in prefix(i)])
    policy = fleet.policy("manual", holdout_fraction=0.0)
    k0, k1 = ev.key(0), ev.key(1)
    confirmed_copy(ev, policy, k0, "node-b")
    confirmed_copy(ev, policy, k0, "node-c")
    confirmed_copy(ev, policy, k1, "node-b")
    ev.served(k0, "node-b", 6, cached=TOKENS)
    ev.served(k1, "node-b", 2, cached=0)
    score_replicas.delay()
    return fleet.operator.get(f"/api/scoreboard/?since={since()}").json()


def test_shape_and_figures_from_scored_evidence(board, settings):
    assert set(board) == {
        "window",
        "totals",
        "shadow_totals",
        "by_policy",
        "by_forecaster",
        "by_tenant",
        "holdout",
        "recommendation",
    }
    assert set(board["totals"]) == M_KEYS
    one = prefill_s(cost_model_for(burst.MODEL), TOKENS)
    nbytes = BLOCKS * BYTES_PER_BLOCK
    t = board["totals"]
    assert t["replicas"] == 3 and t["hits"] == 6 and t["hits_basis"] == "measured"
    assert t["precision"] == pytest.approx(1 / 3)
    assert t["ttft_saved_s"] == pytest.approx(one)  # one prefill for the one used replica
    assert t["saving_basis"] == "cost model"  # the records carried no TTFT
    assert t["bytes_moved"] == 3 * nbytes
    assert t["cost_s"] == pytest.approx(3 * nbytes / settings.PREWARM_LINK_BYTES_PER_S)
    assert {x["tenant"]: x["hits"] for x in board["by_tenant"]} == {"tenant-0": 6, "tenant-1": 0}
    assert [(p["policy"], p["mode"]) for p in board["by_policy"]] == [("p-manual", "manual")]
    ho = board["holdout"]
    assert (ho["treated"]["records"], ho["treated"]["prefixes"], ho["held_out"]["prefixes"]) == (
        3,
        2,
        0,
    )
    assert board["recommendation"]["verdict"] == "insufficient_data"


def test_window_excludes_old_replicas(board):
    now = timezone.now()
    assert scoreboard(now - timedelta(days=30), now - timedelta(days=1))["totals"]["replicas"] == 0
