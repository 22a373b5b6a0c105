"""The replication planner: what to copy where, and why. It lives with the rest of the one
policy in ``controlplane.core.policy.planner`` (its module doc has the benefit model); this
module keeps the name the Celery cycle, the simulator and the benchmarks import."""

from controlplane.core.policy.planner import (
    BENEFIT_MARGIN,
    LIFECYCLES,
    MAX_CLUSTER_QUEUE_S,
    MAX_TARGET_QUEUE_S,
    Budgets,
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
    PlannedMove,
    backs_off,
    backs_off_around,
    cluster_queue_s,
    lam_text,
    plan,
    queue_gate,
)

__all__ = [
    "BENEFIT_MARGIN",
    "LIFECYCLES",
    "MAX_CLUSTER_QUEUE_S",
    "MAX_TARGET_QUEUE_S",
    "Budgets",
    "Candidate",
    "Demand",
    "EngineState",
    "Holding",
    "Overrides",
    "PlannedMove",
    "backs_off",
    "backs_off_around",
    "cluster_queue_s",
    "lam_text",
    "plan",
    "queue_gate",
]
