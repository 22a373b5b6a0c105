"""The live plan cycle charges speculation for the queues its agents report (issue 20): the
same charged planner the simulator runs, with the policy's limits (the knobs' defaults, core.policy.knobs)."""

from __future__ import annotations

from controlplane.core.policy import planner
from controlplane.core.policy.types import Budgets, Candidate, Demand, EngineState, Holding
from controlplane.fleet.models import Engine
from controlplane.replication.models import Policy, ReplicationPlan
from controlplane.replication.tasks import plan_cycle
from harness import burst
from tests.workflow.test_workflow import run_cycle

NODES = ("node-a", "node-b", "node-c")


def report_waiting(fleet, waiting: dict[str, int], seq: int) -> None:
    """The agents report their engines' vLLM ``num_requests_waiting``."""
    for name in NODES:
        keys = burst.PREFIX if name == "node-a" else ()
        fleet.report(name, keys, seq=seq, metrics={"waiting": waiting.get(name, 0)})


def test_a_new_policy_charges_speculation_for_queues(db):
    """A fresh policy's limits hold speculation back where the engines queue: a target queueing
    past two seconds gets no copy, and none at all while the other engines queue a second on
    average; with no queues the same demand is copied."""
    p = Policy.objects.create(name="fresh")
    budgets = Budgets.of(p, horizon_s=300.0, min_confidence=0.0)
    c = Candidate("p", (1, 2, 3), 48, 3 << 20, "t", 0.5, 3.0)
    d = Demand("p", 1200.0)  # 4/s: the holder takes 0.8/s, each replica 1.6/s

    def targets(queue_b: float, queue_c: float) -> set[str]:
        engines = [
            EngineState("a", "n1", 1e10, 1e9, 0.0, 1e10, 0.5),
            EngineState("b", "n2", 1e10, 1e9, 0.0, 1e10, 0.0, queue_s=queue_b),
            EngineState("c", "n3", 1e10, 1e9, 0.0, 1e10, 0.0, queue_s=queue_c),
        ]
        holds = [Holding("p", "a")]
        return {m.target for m in planner.plan([c], [d], holds, engines, budgets)}

    assert targets(0.0, 0.0) == {"b", "c"}
    assert targets(2.5, 0.0) == {"c"}  # b over the target queue limit
    assert targets(1.6, 1.6) == set()  # the engines a copy could go to queue: back off


def test_queued_engines_hold_speculation_back_and_the_summary_says_why(fleet):
    # The prefix's holder and node-b, which does not hold it, have 40 requests waiting (seconds
    # of prefill): the engines a copy could go to queue past the back-off limit on average,
    # though node-c has none (a copy there, charged only its own queue, would otherwise pay).
    report_waiting(fleet, {"node-a": 40, "node-b": 40}, seq=2)
    policy, queued = run_cycle(fleet, "manual")
    gate = queued.summary["queues"]
    assert gate["backed_off"], queued.summary
    assert gate["cluster_queue_s"] > policy.max_cluster_queue_s == 1.0
    assert "held back" in gate["why"] and f"{gate['cluster_queue_s']:.2f} s" in gate["why"]
    a, b = (str(Engine.objects.get(node__name=n).pk) for n in ("node-a", "node-b"))
    assert gate["engines_over_max_queue"] == sorted([a, b])
    assert not queued.items.exists(), list(queued.items.values_list("reason", flat=True))
    # The queues drain: the same forecast and residency now plan the copies.
    report_waiting(fleet, {}, seq=3)
    plan_cycle(policy.pk)
    free = ReplicationPlan.objects.filter(policy=policy).order_by("-created_at").first()
    assert free.pk != queued.pk
    assert free.summary["queues"] == {
        "cluster_queue_s": 0.0,
        "max_cluster_queue_s": 1.0,
        "max_queue_s": 2.0,
        "backed_off": False,
        "engines_over_max_queue": [],
        "why": "",
    }
    assert free.items.exists(), free.summary


def test_a_queue_on_the_prefixs_own_holder_alone_does_not_hold_its_copies_back(fleet):
    # Only the holder queues (its own burst): the mean passes the limit, but the engines that
    # would take a replica do not queue, and a replica there is what relieves the holder.
    report_waiting(fleet, {"node-a": 40}, seq=2)
    policy, plan = run_cycle(fleet, "manual")
    gate = plan.summary["queues"]
    assert gate["backed_off"] and "whose holders carry the queue" in gate["why"]
    targets = {t.node.name for t in (i.target for i in plan.items.all())}
    assert targets and targets <= {"node-b", "node-c"}, plan.summary


def test_an_engine_over_its_queue_limit_gets_no_copy(fleet):
    # One target queues past max_queue_s, the cluster's mean stays under the back-off.
    fleet.report("node-b", (), seq=2, metrics={"waiting": 40})
    policy, plan = run_cycle(fleet, "manual", max_cluster_queue_seconds=None)
    gate = plan.summary["queues"]
    assert not gate["backed_off"] and gate["max_cluster_queue_s"] is None
    b = str(Engine.objects.get(node__name="node-b").pk)
    assert gate["engines_over_max_queue"] == [b] and "no speculative item lands" in gate["why"]
    targets = {t.node.name for t in (i.target for i in plan.items.all())}
    assert targets and "node-b" not in targets
