"""The forecast -> plan cycle as one Celery chain: one array task forecasts every key, the plan
runs after it, and a cycle with nothing to forecast plans nothing."""

from __future__ import annotations

import time

from celery.signals import task_prerun

from controlplane.demand.models import WorkloadKey
from controlplane.forecasting.models import Forecast
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
