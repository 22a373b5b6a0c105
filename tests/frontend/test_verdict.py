"""The scoreboard's verdict from evidence: gateways' records and agents' reports through the API,
scoring and the verdict unpatched. The holdout's arms are drawn by the control plane's own
randomization (a 50% share, permuted blocks); each request is served by an engine that holds its
prefix (the copy's target where a copy was confirmed, else node-a) and its TTFT is that engine's:
the arms' labels never set a TTFT. The map is a prior only where the cluster can be placed on it
(these engines report no GPU, so it cannot)."""

import pytest

from controlplane.replication.models import ReplicationJob
from controlplane.replication.tasks import score_replicas
from tests.workflow.conftest import eager, fleet  # noqa: F401 - the fixtures
from tests.workflow.evidence import TOKENS, Evidence, confirmed_copy, prefix, since

PAIRS = 10  # PREWARM_HOLDOUT_MIN_ASSIGNMENTS: assignments on each arm


@pytest.fixture
def ev(fleet):  # noqa: F811
    e = Evidence(fleet)
    e.report("node-a", [k for i in range(2 * PAIRS) for k in prefix(i)])
    return e


def verdict(fleet):  # noqa: F811
    score_replicas.delay()
    return fleet.operator.get(f"/api/scoreboard/?since={since()}").json()


def holdout_run(ev, fleet, busy_s: float):  # noqa: F811
    """2 x PAIRS prefixes approved under a 50% holdout: the control plane draws which are copied
    to node-b. Each prefix then serves three requests where it is held: on node-b (idle, ~0.2 s)
    if its copy was confirmed there, else on node-a, where every prefix lives and requests take
    ``busy_s``; prefixes differ by up to 0.15 s whatever their arm."""
    policy = fleet.policy("manual", holdout_fraction=0.5)
    keys = [ev.key(i) for i in range(2 * PAIRS)]
    plan = ev.plan(policy, [(k, "node-b") for k in keys])
    assert ev.approve(plan)["refused"] == {}
    for job in ReplicationJob.objects.filter(item__plan=plan):
        ev.land(job)
    copied = {j.item.workload_key_id for j in ReplicationJob.objects.filter(item__plan=plan)}
    ev.report("node-b", [k for i, key in enumerate(keys) if key.pk in copied for k in prefix(i)])
    for i, key in enumerate(keys):
        on_b = key.pk in copied
        base = 0.2 if on_b else busy_s
        ev.served(
            key,
            "node-b" if on_b else "node-a",
            3,
            cached=TOKENS,
            ttft_s=lambda j, i=i, base=base: base + 0.05 * (i % 4) + 0.01 * j,
        )
    return verdict(fleet), len(copied)


def test_too_little_evidence_is_insufficient_data_and_no_map_prior(ev, fleet):  # noqa: F811
    confirmed_copy(ev, fleet.policy("manual", holdout_fraction=0.0), ev.key(0), "node-b")
    rec = verdict(fleet)["recommendation"]
    assert rec["verdict"] == "insufficient_data" and rec["basis"] == "none"
    assert rec["prior"] is None and rec["holdout_assignments"] == 0 and not rec["firm"]
    assert "cannot be placed on the simulator's map" in rec["text"]
    assert "its engines report no GPU" in rec["text"]


def test_measured_uplift_beyond_the_cost_says_speculation_pays(ev, fleet):  # noqa: F811
    board, copied = holdout_run(ev, fleet, busy_s=1.5)
    rec, ho = board["recommendation"], board["holdout"]
    assert copied == PAIRS  # permuted blocks: exactly half drawn treated
    assert rec["verdict"] == "speculation_pays" and rec["basis"] == "holdout" and rec["firm"]
    assert rec["holdout_assignments"] == PAIRS
    assert f"{PAIRS} treated and {PAIRS} held-out assignments, intention to treat" in rec["text"]
    diff = ho["ttft_diff_s"]
    # Per request: treated 0.2 s and held out 1.5 s, plus each prefix's own 0-0.15 s.
    assert diff["diff"] == pytest.approx(-1.3, abs=0.15)
    assert diff["low"] < diff["diff"] < diff["high"] < 0 and diff["df"] > 0
    assert ho["more_assignments_needed"] is None  # resolved
    assert {t["tenant"] for t in ho["by_tenant"]} == {f"tenant-{i}" for i in range(2 * PAIRS)}


def test_an_interval_across_zero_says_how_many_more_assignments(ev, fleet, settings):  # noqa: F811
    settings.PREWARM_LINK_BYTES_PER_S = 1e12  # copies cost next to nothing
    board, _ = holdout_run(ev, fleet, busy_s=0.2)
    rec, ho = board["recommendation"], board["holdout"]
    diff = ho["ttft_diff_s"]
    assert diff["low"] < 0 < diff["high"]  # no effect to speak of
    assert rec["verdict"] == "insufficient_data" and rec["basis"] == "holdout"
    assert not rec["firm"] and "Not yet decided" in rec["text"]
    more = ho["more_assignments_needed"]
    if more is None:  # the arms measured the same mean exactly
        assert "the interval's width" in rec["text"]
    else:
        assert more > 0 and f"about {more} more assignments a side" in rec["text"]


def test_an_interval_tight_around_zero_says_reactive_is_enough(ev, fleet):  # noqa: F811
    """Every prefix serves at the same TTFT on both arms: the interval is zero wide, so even
    its best case cannot pay for the copies."""
    policy = fleet.policy("manual", holdout_fraction=0.5)
    keys = [ev.key(i) for i in range(2 * PAIRS)]
    plan = ev.plan(policy, [(k, "node-b") for k in keys])
    assert ev.approve(plan)["refused"] == {}
    for key in keys:
        ev.served(key, "node-a", 2, cached=TOKENS, ttft_s=0.3)
    rec = verdict(fleet)["recommendation"]
    assert rec["verdict"] == "reactive_enough" and rec["firm"]
    assert "even the interval's best case does not pay" in rec["text"]


def test_copies_costing_more_than_the_intervals_best_case_say_avoid(ev, fleet, settings):  # noqa: F811
    settings.PREWARM_LINK_BYTES_PER_S = 1e6  # 4 MiB copies take ~4 s each
    board, copied = holdout_run(ev, fleet, busy_s=0.2)
    rec, ho = board["recommendation"], board["holdout"]
    assert ho["treated_cost_s"] > 4 * copied
    assert rec["verdict"] == "avoid" and rec["basis"] == "holdout" and rec["firm"]


def test_own_scores_alone_are_a_modelled_verdict_never_firm(ev, fleet, settings):  # noqa: F811
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
    assert rec["verdict"] == "avoid" and rec["basis"] == "modelled (own scores)"
    assert not rec["firm"] and rec["text"].startswith("Modelled, not measured")
