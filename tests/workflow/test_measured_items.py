"""A plan item the measured demand alone asks for (``PlanItem.measured``) is ordinary cache, not
speculation: the approval's speculative VRAM budget does not refuse it, and its copy does not
count against the budget the planner and later approvals read. Through the API."""

from __future__ import annotations

import pytest

from controlplane.replication.choices import ItemDecision
from controlplane.replication.plans.inputs import spec_bytes_by_engine
from tests.workflow.evidence import Evidence, prefix


@pytest.fixture
def ev(fleet):
    e = Evidence(fleet)
    e.report("node-a", [k for i in range(5) for k in prefix(i)])
    return e


def test_a_measured_item_is_outside_the_vram_budget_a_speculative_one_is_not(ev, fleet):
    policy = fleet.policy("manual", holdout_fraction=0.0)
    keys = [ev.key(i) for i in range(5)]
    plan = ev.plan(policy, [(k, "node-b") for k in keys[:3]])
    one = plan.items.get(workload_key=keys[0]).bytes
    policy.max_spec_vram_fraction = one / ev.engine["node-b"].kv_capacity_bytes  # fits one
    policy.save()
    plan.items.filter(workload_key__in=keys[1:3]).update(measured=True)
    refused = ev.approve(plan)["refused"]
    decisions = {i.workload_key_id: i.decision for i in plan.items.all()}
    assert [decisions[k.pk] for k in keys[:3]] == [ItemDecision.APPROVED] * 3, refused
    engine = ev.engine["node-b"].pk
    assert spec_bytes_by_engine([engine]).get(engine, 0) == one  # the speculative one alone
    # the slice is full: a further measured item is approved, a speculative one is refused
    more = ev.plan(policy, [(keys[3], "node-b"), (keys[4], "node-b")])
    more.items.filter(workload_key=keys[3]).update(measured=True)
    refused = ev.approve(more)["refused"]
    assert list(refused) == [str(more.items.get(workload_key=keys[4]).pk)]
    assert "speculative VRAM budget" in next(iter(refused.values()))
