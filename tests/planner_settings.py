"""The planner's settings the policy's unit tests are written against: no charges, no transfer
budget, a 10% speculative VRAM slice, a 5-minute horizon and a 10-minute TTL. A test of one rule
sets only what that rule reads; the policy's own defaults (``core.policy.knobs``) would charge
every item as well."""

from __future__ import annotations

import math

from controlplane.core.policy import knobs
from controlplane.core.policy.types import Budgets

UNCHARGED = {
    "max_spec_vram_fraction": 0.10,
    "max_bytes_per_interval": float(knobs.MAX_BYTES_PER_INTERVAL.high),
    "ttl_s": 600.0,
    "horizon_s": 300.0,
    "min_benefit_ratio": 1.0,
    "max_queue_s": math.inf,
    "max_cluster_queue_s": math.inf,
}


def uncharged(**settings) -> Budgets:
    """``Budgets`` of ``UNCHARGED`` with ``settings`` over them."""
    return Budgets(**{**UNCHARGED, **settings})
