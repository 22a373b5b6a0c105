"""Scoreboard figures from a run through the API: copies approved, landed and confirmed by their
engines' KV events, requests served from gateways' records, scoring run, nothing set by hand."""

from datetime import timedelta

import pytest
from django.utils import timezone

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
    """Three confirmed copies (two tenants); tenant-0's copy on node-b serves 6 hits in 0.10 s
    while its prefix misses on node-c in 0.13 s."""
    ev = Evidence(fleet)
    ev.report("node-a", [k for i in range(2) for k in prefix(i)])
    policy = fleet.policy("manual", holdout_fraction=0.0)
    k0, k1 = ev.key(0), ev.key(1)
    confirmed_copy(ev, policy, k0, "node-b")
    confirmed_copy(ev, policy, k0, "node-c")
    confirmed_copy(ev, policy, k1, "node-b")
    ev.served(k0, "node-b", 6, cached=TOKENS, ttft_s=0.10)
    ev.served(k0, "node-c", 2, cached=0, ttft_s=0.13)
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
        "items",
        "recommendation",
        "guard",
        "value_model",
    }
    assert board["guard"] is None  # no plan cycle ran: no plan carries the guard's state
    assert set(board["totals"]) == M_KEYS
    nbytes = BLOCKS * BYTES_PER_BLOCK
    t = board["totals"]
    assert t["replicas"] == 3 and t["hits"] == 6 and t["hits_basis"] == "measured"
    assert t["precision"] == pytest.approx(1 / 3)
    # The one used replica: its prefix's misses took 0.13 s, its hits 0.10 s.
    assert t["ttft_saved_s"] == pytest.approx(0.03) and t["saving_basis"] == "measured TTFT"
    assert t["bytes_moved"] == 3 * nbytes
    assert t["cost_s"] == pytest.approx(3 * nbytes / settings.PREWARM_LINK_BYTES_PER_S)
    assert {x["tenant"]: x["hits"] for x in board["by_tenant"]} == {"tenant-0": 6, "tenant-1": 0}
    assert [(p["policy"], p["mode"]) for p in board["by_policy"]] == [("p-manual", "manual")]
    ho = board["holdout"]
    assert (ho["treated"]["assignments"], ho["held_out"]["assignments"]) == (0, 0)
    assert ho["ttft_diff_s"] is None  # no draws with the holdout off: no comparison
    rec = board["recommendation"]
    assert rec["verdict"] == "insufficient_data" and rec["firm"] is False


def test_each_item_shows_the_model_beside_what_can_be_credited_and_what_was(board):
    """The planner modelled 1.0 s per item (``Evidence.plan``); one prefill of 1,024 tokens of
    llama3-70b on an H100 (~74 ms) is the most the scoreboard can credit; the used copy was
    credited its measured 30 ms, the others nothing."""
    rows = board["items"]
    assert len(rows) == 3 and {r["modelled_s"] for r in rows} == {1.0}
    assert all(0.03 < r["creditable_s"] < 0.15 for r in rows)
    assert sorted(round(r["realised_s"], 3) for r in rows) == [0.0, 0.0, 0.03]
    assert [r["used"] for r in rows].count(True) == 1


def test_plan_items_in_the_api_carry_what_can_be_credited(board, fleet):  # noqa: F811
    items = fleet.operator.get("/api/plans/").json()["results"][0]["items"]
    one = items[0]
    assert one["expected_ttft_saved_s"] == 1.0 and 0.03 < one["creditable_ttft_s"] < 0.15


def test_window_excludes_old_replicas(board):
    now = timezone.now()
    assert scoreboard(now - timedelta(days=30), now - timedelta(days=1))["totals"]["replicas"] == 0
