"""The forecast -> plan cycle as one Celery chain: one array task forecasts every key, the plan
runs after it, and a cycle with nothing to forecast plans nothing."""

from __future__ import annotations

import time

from celery.signals import task_prerun

from controlplane.demand.models import WorkloadKey
from controlplane.forecasting.models import Forecast
from controlplane.replication import tasks
from controlplane.replication.models import ReplicationPlan
from controlplane.replication.tasks import forecast_then_plan
from harness import burst


def ran_tasks():
    names: list[str] = []

    def seen(sender=None, **_):
        names.append(sender.name.rsplit(".", 1)[-1])

    task_prerun.connect(seen, weak=False)
    return names, lambda: task_prerun.disconnect(seen)


def test_one_array_task_forecasts_every_key_then_one_plan(fleet):
    p = fleet.policy("shadow")
    end = time.time()
    fleet.post_burst(end)
    # A second tenant with the same prompts: a second workload key.
    resp = fleet.gateway.post(
        "/api/request-records/",
        {"records": [{**r, "tenant": "second"} for r in burst.records(end)]},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    keys = WorkloadKey.objects.count()
    names, done = ran_tasks()
    try:
        forecast_then_plan(p)
    finally:
        done()
    assert keys >= 2 and names.count("forecast_all") == 1
    assert names.index("plan_after_forecasts") > names.index("forecast_all")
    assert Forecast.objects.count() == keys
    assert ReplicationPlan.objects.filter(policy=p).count() == 1


def test_nothing_to_forecast_plans_nothing(fleet):
    p = fleet.policy("shadow")
    forecast_then_plan(p)
    assert not Forecast.objects.exists()
    assert not ReplicationPlan.objects.filter(policy=p).exists()


def test_a_forecast_still_running_does_not_hold_back_the_plan_cadence(fleet, monkeypatch):
    """Predictive plans on measured demand at the plan cadence, as reactive does: a tick that
    finds a forecast due (its last one older than its cadence, or still running) and a plan due
    starts both, not the forecast alone."""
    p = fleet.policy("shadow", strategy="predictive")
    fleet.post_burst(time.time())
    started: list[int] = []
    # The forecast chain is slow: it has not finished when the tick looks.
    monkeypatch.setattr(tasks, "forecast_then_plan", lambda policy: started.append(policy.pk))
    due = tasks.tick()
    assert due["forecast"] and due["plan"] and started == [p.pk]
    plan = ReplicationPlan.objects.get(policy=p)
    assert plan.summary["trigger"] == "cycle" and plan.summary["strategy"] == "predictive"
