"""The value model answers to outcomes, live: plan items store the model's terms, scored copies
measure them (``replication.plans.value``), the scoreboard and its API show the ratio per term,
and the next plan cycle values its items by the corrected model."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from controlplane.core.policy.value import REPLICA, REQUESTS, SAVING, ValueTerms
from controlplane.replication.models import PlanItem, ReplicationPlan, SpeculativeReplica
from controlplane.replication.plans import value as live_value
from controlplane.replication.tasks import plan_cycle, score_replicas
from tests.workflow.evidence import TOKENS, Evidence, confirmed_copy, prefix, since
from tests.workflow.test_workflow import run_cycle

# The committed demo scoreboard's item: modelled 1,901.7 s, creditable at most one prefill.
INFLATED = ValueTerms(REPLICA, requests=196.0, saving_s=9.7025, discount=1.0)


def test_inflated_items_show_a_ratio_far_below_one_on_the_scoreboard(fleet):
    """Three confirmed copies modelled at 1,901.7 s each; one serves 6 hits and is credited its
    measured 30 ms (misses 0.13 s, hits 0.10 s), the others nothing."""
    ev = Evidence(fleet)
    ev.report("node-a", [k for i in range(2) for k in prefix(i)])
    policy = fleet.policy("manual", holdout_fraction=0.0)
    k0, k1 = ev.key(0), ev.key(1)
    for key, target in ((k0, "node-b"), (k0, "node-c"), (k1, "node-b")):
        confirmed_copy(ev, policy, key, target)
    PlanItem.objects.update(value_terms=INFLATED.as_dict())
    # Their modelled horizon has passed: placed a horizon and a minute ago.
    back = timedelta(seconds=policy.horizon_s + 60)
    for r in SpeculativeReplica.objects.all():
        SpeculativeReplica.objects.filter(pk=r.pk).update(placed_at=r.placed_at - back)
    ev.served(k0, "node-b", 6, cached=TOKENS, ttft_s=0.10)
    ev.served(k0, "node-c", 2, cached=0, ttft_s=0.13)
    score_replicas.delay()
    board = fleet.operator.get(f"/api/scoreboard/?since={since()}").json()
    vm = board["value_model"]
    assert vm["copies"] == 3 and vm["ratio"] < 1e-4
    rows = {(r["kind"], r["term"]): r for r in vm["terms"]}
    req, saving = rows[(REPLICA, REQUESTS)], rows[(REPLICA, SAVING)]
    assert req["modelled"] == pytest.approx(3 * 196.0) and req["measured"] == 6
    assert req["ratio"] == pytest.approx(6 / 588, abs=1e-4)
    assert saving["copies"] == 1 and saving["ratio"] < 0.001
    # three copies of evidence move the factors a little, towards the measured ratios
    assert 0.8 < req["factor"] < 1.0 and 0.8 < saving["factor"] < 1.0
    page = Client()
    page.force_login(User.objects.get(username="op"))
    html = page.get("/scoreboard/").content.decode()
    assert 'id="value-model"' in html and "0.010" in html


def _outcomes(items: list[PlanItem], n: int) -> None:
    """``n`` scored copies of each item, long past their horizon: each used once and credited a
    millisecond (a model far above what its copies measured)."""
    now = timezone.now()
    past = now - timedelta(hours=1)
    for it in items:
        for _ in range(n):
            SpeculativeReplica.objects.create(
                item=it,
                engine=it.target,
                workload_key=it.workload_key,
                prefix_keys=it.prefix_keys,
                bytes=it.bytes,
                placed_at=past,
                expires_at=past + timedelta(seconds=1),
                confirmed_at=past,
                scored_at=now,
                hits=1,
                ttft_saved_s=0.001,
            )


def test_the_plan_cycle_values_items_by_the_corrected_model(fleet):
    policy, first = run_cycle(fleet, "manual", holdout_fraction=0.0)
    items = list(first.items.all())
    assert items, first.summary
    for it in items:
        terms = ValueTerms.from_dict(it.value_terms)
        assert terms is not None and it.expected_ttft_saved_s == pytest.approx(terms.value)
    _outcomes(items, 30)
    cal = live_value.calibration(timezone.now())
    kinds = {ValueTerms.from_dict(it.value_terms).kind for it in items}
    assert all(cal.factor(k, REQUESTS) * cal.factor(k, SAVING) < 0.9 for k in kinds)
    plan_cycle(policy.pk)
    nxt = ReplicationPlan.objects.filter(policy=policy).order_by("-created_at").first()
    assert nxt.pk != first.pk
    again = list(nxt.items.all())
    assert again
    for it in again:
        terms = ValueTerms.from_dict(it.value_terms)
        assert it.expected_ttft_saved_s == pytest.approx(cal.value(terms), rel=1e-6)
        assert it.expected_ttft_saved_s < 0.9 * terms.value
