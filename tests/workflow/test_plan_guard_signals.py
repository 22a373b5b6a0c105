"""The harm guard's group signals in the live plan cycle (``replication.plans.guard``): a copy a
request of its prefix reached its target before (a ``warming`` miss), and treated prefixes
slower than held-out ones in the holdout's closed windows, cut the next plan's allowance of the
prefix group, and the plan summary says why; evidence of neither cuts nothing. All through the
API (gateways' records, agents' job events and reports), the cycle run as the task runs it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Max

from controlplane.replication.choices import ItemDecision
from controlplane.replication.models import HoldoutDraw, ReplicationJob
from controlplane.replication.plans import cycle, holdout
from tests.workflow.evidence import TOKENS, Evidence, prefix


@pytest.fixture
def ev(fleet):
    e = Evidence(fleet)
    e.report("node-a", [k for i in range(3) for k in prefix(i)])
    return e


def _guard_after(policy, now=None) -> dict:
    """The next plan cycle's guard summary."""
    return cycle.run_cycle(policy.pk, now=now).summary["guard"]


def _copy_with_requests_on(ev, fleet, target_served: str, cached: int) -> dict:
    """A plan cycle (the guard's last observation), then one copy of key 0 to node-b: while it
    is in flight, two requests of its prefix are served by ``target_served``; it lands and
    node-b's KV events show it; the next cycle plans."""
    policy = fleet.policy("manual", holdout_fraction=0.0)
    key = ev.key(0)
    assert _guard_after(policy)["allowed"] == 1.0
    plan = ev.plan(policy, [(key, "node-b")])
    assert ev.approve(plan)["refused"] == {}
    job = ReplicationJob.objects.get(item__plan=plan)
    ev.served(key, target_served, 2, cached=cached, ttft_s=0.5)
    ev.land(job)
    ev.report("node-b", prefix(0))
    job.refresh_from_db()
    assert job.state == "confirmed", job.state
    return _guard_after(policy)


def test_a_copy_whose_prefix_reached_its_target_before_it_landed_cuts_its_group(ev, fleet):
    g = _copy_with_requests_on(ev, fleet, "node-b", cached=0)  # ``warming`` misses
    assert g["allowed"] == 0.5 and g["groups"] == {"tenant-0": 0.5} and not g["engines"], g
    assert "group:tenant-0 cut to 0.5: a copy took" in g["why"], g
    assert "a request it was for came" in g["why"], g


def test_a_copy_whose_prefix_stayed_on_its_holder_leaves_the_budget_whole(ev, fleet):
    g = _copy_with_requests_on(ev, fleet, "node-a", cached=TOKENS)  # hits on the holder
    assert g["allowed"] == 1.0 and not g["groups"] and "full budget" in g["why"], g


def _arms_then_cycle(ev, fleet, monkeypatch, treated_s: float, held_s: float) -> dict:
    """Two prefixes of one tenant (one prefix group): key 0 drawn treated, key 1 held out; their
    requests' TTFT; the next cycle runs once both assignments' windows have closed."""
    policy = fleet.policy("manual", holdout_fraction=0.5)
    coins = iter([0.9, 0.1])
    monkeypatch.setattr(holdout, "_uniform", lambda: next(coins))
    k0, k1 = ev.key(0, tenant="acme"), ev.key(1, tenant="acme")
    assert _guard_after(policy)["allowed"] == 1.0
    plan = ev.plan(policy, [(k0, "node-b"), (k1, "node-b")])
    assert ev.approve(plan)["refused"] == {}
    decisions = {i.workload_key_id: i.decision for i in plan.items.all()}
    assert decisions == {k0.pk: ItemDecision.APPROVED, k1.pk: ItemDecision.HELD_OUT}
    ev.served(k0, "node-a", 3, cached=TOKENS, ttft_s=treated_s)
    ev.served(k1, "node-a", 3, cached=TOKENS, ttft_s=held_s)
    assert set(HoldoutDraw.objects.values_list("ttft_n", flat=True)) == {3}
    closed = HoldoutDraw.objects.aggregate(end=Max("window_end"))["end"]
    # No window closed yet: nothing to compare, nothing cut.
    assert _guard_after(policy)["allowed"] == 1.0
    return _guard_after(policy, now=closed + timedelta(seconds=1))


def test_treated_prefixes_slower_than_held_out_ones_cut_their_group(ev, fleet, monkeypatch):
    g = _arms_then_cycle(ev, fleet, monkeypatch, treated_s=1.5, held_s=1.0)
    assert g["allowed"] == 0.5 and g["groups"] == {"acme": 0.5}, g
    assert "group:acme cut to 0.5: treated TTFT 1.500 s above held-out 1.000 s" in g["why"], g


def test_treated_prefixes_as_fast_as_held_out_ones_cut_nothing(ev, fleet, monkeypatch):
    g = _arms_then_cycle(ev, fleet, monkeypatch, treated_s=0.9, held_s=1.0)
    assert g["allowed"] == 1.0 and not g["groups"], g
