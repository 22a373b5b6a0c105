"""The harm guard's group signals in the live plan cycle (``replication.plans.guard_feed``): a copy a
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


def _arms_then_cycle(ev, fleet, monkeypatch, treated_s: tuple, held_s: tuple) -> dict:
    """Four prefixes of one tenant (one prefix group): two drawn treated, two held out (the
    draw's coins; which key gets which is the draw's order); each assignment's requests at the
    TTFT given for its arm; the next cycle runs once every assignment's window has closed."""
    ev.report("node-a", prefix(3))
    policy = fleet.policy("manual", holdout_fraction=0.5)
    coins = iter([0.9, 0.9, 0.1, 0.1])
    monkeypatch.setattr(holdout, "_uniform", lambda: next(coins))
    keys = [ev.key(i, tenant="acme") for i in range(4)]
    assert _guard_after(policy)["allowed"] == 1.0
    plan = ev.plan(policy, [(k, "node-b") for k in keys])
    assert ev.approve(plan)["refused"] == {}
    decisions = {i.workload_key_id: i.decision for i in plan.items.all()}
    treated = [k for k in keys if decisions[k.pk] == ItemDecision.APPROVED]
    held = [k for k in keys if decisions[k.pk] == ItemDecision.HELD_OUT]
    assert len(treated) == len(held) == 2, decisions
    for key, ttft in zip([*treated, *held], (*treated_s, *held_s), strict=True):
        ev.served(key, "node-a", 3, cached=TOKENS, ttft_s=ttft)
    assert set(HoldoutDraw.objects.values_list("ttft_n", flat=True)) == {3}
    closed = HoldoutDraw.objects.aggregate(end=Max("window_end"))["end"]
    # No window closed yet: nothing to compare, nothing cut.
    assert _guard_after(policy)["allowed"] == 1.0
    return _guard_after(policy, now=closed + timedelta(seconds=1))


def test_treated_prefixes_slower_than_held_out_ones_cut_their_group(ev, fleet, monkeypatch):
    g = _arms_then_cycle(ev, fleet, monkeypatch, treated_s=(1.5, 1.6), held_s=(1.0, 1.1))
    assert g["allowed"] == 0.5 and g["groups"] == {"acme": 0.5}, g
    assert "group:acme cut to 0.5: treated TTFT 1.550 s above held-out 1.050 s" in g["why"], g


def test_treated_prefixes_slower_only_within_noise_cut_nothing(ev, fleet, monkeypatch):
    # Treated's mean is 0.55 s above held-out's, but its two assignments differ by 1.2 s: the
    # difference's interval reaches below zero.
    g = _arms_then_cycle(ev, fleet, monkeypatch, treated_s=(1.0, 2.2), held_s=(1.0, 1.1))
    assert g["allowed"] == 1.0 and not g["groups"], g


def test_treated_prefixes_as_fast_as_held_out_ones_cut_nothing(ev, fleet, monkeypatch):
    g = _arms_then_cycle(ev, fleet, monkeypatch, treated_s=(0.9, 1.0), held_s=(1.0, 1.1))
    assert g["allowed"] == 1.0 and not g["groups"], g
