"""Replication at ingest: a hot spot seen in request records as they arrive is planned and, in
auto mode, dispatched before the ingest's reply, with no forecast and no plan cycle; the
strategy, the approval mode and the overrides decide as they do at the cycle."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from controlplane.forecasting.models import Forecast
from controlplane.replication.choices import JobState, OverrideKind
from controlplane.replication.models import Override, ReplicationJob, ReplicationPlan
from controlplane.replication.plans import react
from controlplane.replication.plans.cycle import run_cycle
from harness import burst
from tests.workflow.test_plan_queues import report_waiting


@pytest.fixture(autouse=True)
def at_ingest(fleet, settings):
    settings.PREWARM_REACT_AT_INGEST = True  # after the fleet fixture turned it off


def ingest(fleet, mode: str, **policy):
    react.BOUND.reset()  # a fresh process: no key re-planned a moment ago
    p = fleet.policy(mode, **policy)
    fleet.post_burst(time.time())
    return p, ReplicationPlan.objects.filter(policy=p, summary__trigger="ingest").first()


def test_reactive_copies_a_hot_prefix_at_ingest_with_no_forecast(fleet):
    policy, plan = ingest(fleet, "auto", strategy="reactive")
    assert not Forecast.objects.exists()
    assert plan is not None, ReplicationPlan.objects.values_list("summary", flat=True)
    assert plan.summary["strategy"] == "reactive" and plan.items.exists()
    item = plan.items.first()
    assert item.source.node.name == "node-a" and item.target.node.name in ("node-b", "node-c")
    assert "overflows its holders" in item.reason
    job = ReplicationJob.objects.get(item=item)
    assert job.state == JobState.DISPATCHED
    # The same burst again: the copy on its way counts as a holder, nothing is planned twice.
    react.BOUND.reset()
    fleet.post_burst(time.time())
    again = ReplicationPlan.objects.filter(summary__trigger="ingest").exclude(pk=plan.pk)
    assert not ReplicationJob.objects.exclude(pk=job.pk).filter(target=job.target).exists()
    assert all(p.items.count() == 0 or p.items.first().target != job.target for p in again)


def test_manual_mode_leaves_the_ingest_plan_to_an_operator(fleet):
    _, plan = ingest(fleet, "manual", strategy="reactive")
    assert plan is not None and plan.items.exists() and plan.state == "proposed"
    assert not ReplicationJob.objects.exists()


def test_strategy_off_and_a_freeze_plan_nothing_at_ingest(fleet):
    _, plan = ingest(fleet, "auto", strategy="off")
    assert plan is None and not ReplicationPlan.objects.exists()
    Override.objects.create(kind=OverrideKind.FREEZE, reason="maintenance")
    _, plan = ingest(fleet, "auto", strategy="reactive", name="frozen")
    assert plan is None and not ReplicationJob.objects.exists()


def post_steady(fleet) -> None:
    """The burst's records spread evenly over its last two minutes: busy, but no onset."""
    recs = burst.records(time.time())
    last = recs[-1]["time"]
    for i, r in enumerate(recs):
        r["time"] = last - (len(recs) - 1 - i) * 120.0 / len(recs)
    resp = fleet.gateway.post("/api/request-records/", {"records": recs}, format="json")
    assert resp.status_code == 200, resp.content


def test_predictive_replans_a_bursts_onset_at_ingest(fleet):
    # The burst's last five seconds run at 3x its minute's rate: an onset, planned at once.
    _, plan = ingest(fleet, "auto", strategy="predictive")
    assert not Forecast.objects.exists()
    assert plan is not None and plan.summary["strategy"] == "predictive"
    assert ReplicationJob.objects.filter(item__plan=plan, state=JobState.DISPATCHED).exists()


def test_predictive_falls_back_to_the_reactive_rule_at_ingest_where_a_holder_queues(fleet):
    react.BOUND.reset()
    fleet.policy("auto", strategy="predictive")
    report_waiting(fleet, {}, seq=3)  # every engine reports no queue
    fleet.report("node-a", burst.PREFIX, seq=4, metrics={"running": 0})  # the holder idles
    post_steady(fleet)  # steady demand its idle holder takes: left to the forecasts
    assert not ReplicationPlan.objects.exists()
    # Its holder queues 40 requests: the guarded reactive fallback copies at ingest.
    report_waiting(fleet, {"node-a": 40}, seq=5)
    react.BOUND.reset()
    post_steady(fleet)
    plan = ReplicationPlan.objects.filter(summary__trigger="ingest").first()
    assert plan is not None and plan.items.exists(), plan
    assert {i.target.node.name for i in plan.items.all()} <= {"node-b", "node-c"}


def test_hot_fanout_copies_a_hot_prefix_its_idle_holder_could_serve(fleet):
    fleet.report("node-a", burst.PREFIX, seq=3, metrics={"running": 0})  # the holder idles
    _, plan = ingest(fleet, "auto", strategy="reactive")
    assert plan is None  # its holder takes the measured demand: reactive copies nothing
    _, plan = ingest(fleet, "auto", strategy="reactive", hot_fanout=True, name="fanout")
    assert plan is not None, ReplicationPlan.objects.values_list("summary", flat=True)
    # Mooncake's fanout: one more copy in HBM (two memory replicas), whatever the holder's load.
    assert plan.items.count() == 1 and plan.items.get().reason.startswith("hot fanout: ")


def test_live_predictive_plans_measured_demand_with_no_forecast_and_shows_both_parts(
    fleet, settings
):
    """Predictive is reactive plus foresight: with no forecast at all (a fresh install) its plan
    cycle still copies what the last minute measured, and the summary, the API and the plan page
    show each item's measured and forecast demand."""
    settings.PREWARM_REACT_AT_INGEST = False  # the plan cycle alone
    p = fleet.policy("manual", strategy="predictive")
    now = timezone.now()
    fleet.post_burst(now.timestamp())  # the cycle runs as of then: the burst's last minute
    assert not Forecast.objects.exists()
    plan = run_cycle(p.pk, now=now)
    assert plan is not None and plan.items.exists(), plan and plan.summary
    parts = plan.summary["demand"]
    assert parts and all(
        d["measured_per_s"] > 0
        and d["forecast_per_s"] == 0
        and d["planned_per_s"] >= d["measured_per_s"]
        for d in parts.values()
    )
    item = fleet.operator.get(f"/api/plans/{plan.pk}/").json()["items"][0]
    assert item["demand"] == parts[str(item["workload_key"])]
    browser = Client()
    browser.force_login(User.objects.get(username="op"))
    page = browser.get(f"/plans/{plan.pk}/").content.decode()
    assert f"{item['demand']['measured_per_s']:.2f}/s / –" in page


def test_the_ingest_bound_holds_back_a_second_copy_of_a_prefix_on_its_way(fleet):
    """The burst again seconds later, its first copy still on its way: the storm bound re-plans
    nothing (that copy is not a holder yet, so the planner would send another elsewhere), and
    the plan summary counts what the bound did."""
    _, plan = ingest(fleet, "auto", strategy="reactive")
    assert plan is not None and plan.summary["ingest"]["copies"] == plan.items.count() >= 1
    react.BOUND.replanned.clear()  # past the re-plan interval, as if seconds later
    fleet.post_burst(time.time())
    assert react.BOUND.held_back_replans >= 1
    assert ReplicationJob.objects.count() == plan.items.count()
