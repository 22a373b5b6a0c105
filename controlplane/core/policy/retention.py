"""Retention: what the ranking values stays where it is until the next round (a lease: in a
real fleet an LMCache pin). Not above the planner's load gate or while the cluster queues: near
saturation the room a lease holds is worth more to the requests queueing now."""

from __future__ import annotations

from controlplane.core.policy.types import Budgets

PIN_MIN_EXPECTED = 1.0  # requests expected per holder in the horizon to keep a prefix there


def leases_allowed(*, load: float, cluster_queue_s: float, budgets: Budgets) -> bool:
    return load <= budgets.max_load and cluster_queue_s <= budgets.max_cluster_queue_s


def keeps(*, rate: float, holders: int, horizon_s: float) -> bool:
    """A prefix expected to serve at least ``PIN_MIN_EXPECTED`` requests per holder stays."""
    return holders > 0 and rate * horizon_s / holders >= PIN_MIN_EXPECTED
