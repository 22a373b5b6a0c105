"""The simulator's policies by name (``prewarm-sim --policies``): the routing policies of
``policies.py`` and the planned ones of ``planned.py``, which builds on them, so the factory sits
above both and neither imports the other back."""

from __future__ import annotations

from controlplane.core.policy.reactive import ReactiveRule
from controlplane.core.policy.types import Budgets
from controlplane.sim import routers
from controlplane.sim.planned import SIMULATED, UNCORRECTED, UNGUARDED, PlannedPolicy
from controlplane.sim.policies import (
    POLICIES,
    ROUTING_REACTIVE,
    Everywhere,
    HotFanout,
    Reactive,
    RoutingPolicy,
)


def make_policy(name: str, **options) -> RoutingPolicy:
    if name == "random":
        p = RoutingPolicy(routers.random_router)
    elif name == "round-robin":
        p = RoutingPolicy(routers.RoundRobin())
    elif name == "least-loaded":
        p = RoutingPolicy(routers.least_loaded)
    elif name == "cache-aware":
        p = RoutingPolicy()
    elif name in (ROUTING_REACTIVE, "reactive-naive"):
        p = Reactive(options.get("reactive_rule", ReactiveRule()), naive=name != ROUTING_REACTIVE)
        p.name = name
        return p
    elif name == "everywhere":
        return Everywhere()
    elif name == "hot-fanout":
        return HotFanout()
    elif name in ("reactive", "predictive", "clairvoyant"):
        return PlannedPolicy(name, **{"budgets": Budgets(**SIMULATED), **options})
    elif name == UNGUARDED:
        # predictive without the harm guard: the guard's before/after in the same run
        return PlannedPolicy(
            "predictive", **{"budgets": Budgets(**SIMULATED), **options, "guard": False}
        )
    elif name in UNCORRECTED:
        # the value model's ratios kept, its correction not applied
        # (its name stays the strategy's: the runner labels the run by the name asked for)
        return PlannedPolicy(
            name.split("-")[0],
            **{"budgets": Budgets(**SIMULATED), **options, "value_correction": False},
        )
    else:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    p.name = name
    return p
