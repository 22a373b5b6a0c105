"""The harm guard in the live plan cycle (``core.policy.harm_guard`` fed by
``replication.plans.guard_feed``): copies that raise their targets' queue beyond the limit cut the
next plans' speculation, and the plan summary says how much is allowed and why."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from controlplane.readmodels.metrics import StateCollector
from controlplane.replication.models import ReplicationJob, ReplicationPlan, SpeculativeReplica
from controlplane.replication.tasks import plan_cycle
from harness import burst
from tests.workflow.test_plan_queues import NODES
from tests.workflow.test_workflow import finish, run_cycle


def gauge() -> float:
    """``prewarm_plan_guard_allowed`` as a scrape reads it."""
    (fam,) = (m for m in StateCollector().collect() if m.name == "prewarm_plan_guard_allowed")
    (sample,) = fam.samples
    return sample.value


def scoreboard_guard(fleet) -> tuple[dict, str]:
    """The guard as ``GET /api/scoreboard/`` and the scoreboard page show it."""
    board = fleet.operator.get("/api/scoreboard/").json()
    page = Client()
    page.force_login(User.objects.get(username="op"))
    html = page.get("/scoreboard/").content.decode()
    return board["guard"], html


def _copies_land_then_targets_report(fleet, waiting: int):
    """An auto plan's copies land; then every engine reports ``waiting`` requests but the
    prefix's holder (node-a), and the next cycle plans."""
    policy, plan = run_cycle(fleet, "auto", holdout_fraction=0.0)
    assert plan.summary["guard"]["allowed"] == 1.0, plan.summary
    jobs = list(ReplicationJob.objects.filter(item__plan=plan))
    assert jobs, plan.summary
    for job in jobs:
        finish(fleet, job)
    targets = {str(j.target_id) for j in jobs}
    assert SpeculativeReplica.objects.filter(shadow=False, held_out=False).count() == len(jobs)
    for seq, name in enumerate(NODES, start=3):
        keys = burst.PREFIX if name == "node-a" else ()
        fleet.report(name, keys, seq=seq, metrics={"waiting": 0 if name == "node-a" else waiting})
    plan_cycle(policy.pk)
    nxt = ReplicationPlan.objects.filter(policy=policy).order_by("-created_at").first()
    assert nxt.pk != plan.pk
    return targets, nxt.summary["guard"]


def test_copies_that_raise_their_targets_queue_cut_the_next_plans_budget(fleet):
    targets, g = _copies_land_then_targets_report(fleet, waiting=40)
    assert g["allowed"] == 0.5 and set(g["engines"]) == targets, g
    assert g["engines"] == {t: 0.5 for t in targets}
    assert "raised its queue from 0.00 s to" in g["why"] and "limit 2 s" in g["why"], g
    assert gauge() == 0.5
    # The scoreboard says so too: how much is allowed now, what is cut, and why.
    board, html = scoreboard_guard(fleet)
    assert board["allowed"] == 0.5 and board["engines"] == g["engines"], board
    assert board["why"] == g["why"] and board["policy"] == "p-auto", board
    assert "Speculation allowed now: 50% of its budget" in html
    assert "raised its queue from 0.00 s to" in html
    assert all(f"engine #{t}" in html for t in targets), html


def test_copies_whose_targets_stay_idle_leave_the_budget_whole(fleet):
    _, g = _copies_land_then_targets_report(fleet, waiting=0)
    assert g["allowed"] == 1.0 and not g["engines"] and "full budget" in g["why"], g
    # Its concentration signal: no prefix left on fewer holders than measured demand alone.
    assert g["spread"] == {"narrowed": 0, "restored": 0, "held_back": 0, "why": ""}, g
    assert gauge() == 1.0
    board, html = scoreboard_guard(fleet)
    assert board["allowed"] == 1.0 and not board["engines"] and board["why"] == g["why"]
    assert board["spread"] == g["spread"] and 'id="guard-spread"' not in html
    assert "Speculation allowed now: 100% of its budget" in html
