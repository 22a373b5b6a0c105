"""The policy's knobs: each setting an operator tunes on a policy (``replication.models.Policy``),
with its default, its range and the budget it becomes in the core (``types.Budgets``), declared
here once. The model's defaults, validators, check constraints and columns, the API's names
and ranges, the budgets' defaults and checks, and the launchers' settings all read them.

Defaults are what a new deployment runs. A caller that needs another value (the simulator's
experiment setting, a demo's compressed cadences) passes it as a named setting, never as a
second default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3
DAY_S = 86400


@dataclass(frozen=True)
class Knob:
    """One policy setting. ``budget``: the ``Budgets`` field it becomes (same unit: seconds stay
    seconds, bytes bytes); None where only the control plane reads it. ``nullable``: empty means
    no limit (infinite in the budgets)."""

    field: str
    default: float | None
    low: float
    high: float
    budget: str | None = None
    nullable: bool = False
    integer: bool = False
    # The name outside the code where it differs from ``field``: the REST API's field, the
    # policy form's input and the database column keep ``*_seconds`` (durations are ``*_s`` in
    # the code).
    api_name: str = ""

    def __post_init__(self) -> None:
        if self.default is not None and not self.low <= self.default <= self.high:
            raise ValueError(
                f"{self.field}: default {self.default} outside [{self.low}, {self.high}]"
            )

    @property
    def api(self) -> str:
        """The knob's name in the REST API, the policy form and the database column."""
        return self.api_name or self.field

    @property
    def budget_default(self) -> float:
        """The default as the budgets hold it (no limit: infinite)."""
        return math.inf if self.default is None else float(self.default)

    def allows(self, value: float | None) -> bool:
        """Whether ``value`` is in range (None, or infinite in the budgets, where no limit is
        allowed)."""
        if value is None or (self.nullable and value == math.inf):
            return self.nullable
        return self.low <= value <= self.high


# Speculative replicas may hold at most this share of each GPU's KV capacity. Above half, they
# would crowd out the working set of the requests the engine serves.
MAX_SPEC_VRAM_FRACTION = Knob("max_spec_vram_fraction", 0.05, 0.0, 0.5, "max_spec_vram_fraction")
# Bytes all copies may move in ``interval_s`` (the planner's per-plan transfer budget too).
MAX_BYTES_PER_INTERVAL = Knob(
    "max_bytes_per_interval", 200 * GIB, 0, 2**62, "max_bytes_per_interval", integer=True
)
INTERVAL_S = Knob("interval_s", 60, 1, DAY_S, integer=True, api_name="interval_seconds")
# Forecasts below this confidence add nothing to a key's demand.
MIN_CONFIDENCE = Knob("min_confidence", 0.5, 0.0, 1.0, "min_confidence")
REPLICA_TTL_S = Knob(
    "replica_ttl_s", 900, 10, 7 * DAY_S, "ttl_s", integer=True, api_name="replica_ttl_seconds"
)
HORIZON_S = Knob(
    "horizon_s", 600, 10, 7 * DAY_S, "horizon_s", integer=True, api_name="horizon_seconds"
)
FORECAST_EVERY_S = Knob(
    "forecast_every_s", 300, 10, DAY_S, integer=True, api_name="forecast_every_seconds"
)
PLAN_EVERY_S = Knob("plan_every_s", 30, 1, DAY_S, integer=True, api_name="plan_every_seconds")
# The holdout's share; empty: the deployment's ``PREWARM_HOLDOUT_FRACTION``.
HOLDOUT_FRACTION = Knob("holdout_fraction", None, 0.0, 1.0, nullable=True)
# What speculation is charged (docs/simulator.md, "What predictive's items are charged"): a
# speculative item's expected saving must be this many times what it takes (copy time, the
# displaced blocks' expected value, the target's queue); none lands on a serving engine queueing
# over ``max_queue_s``; while the serving engines queue ``max_cluster_queue_s`` on
# average the planner backs off (warm-ups of joining engines, and copies of a prefix whose
# holders alone carry the queue, aside). Empty limits: none.
MIN_BENEFIT_RATIO = Knob("min_benefit_ratio", 2.0, 1.0, 1000.0, "min_benefit_ratio")
MAX_QUEUE_S = Knob(
    "max_queue_s", 2.0, 0.0, DAY_S, "max_queue_s", nullable=True, api_name="max_queue_seconds"
)
MAX_CLUSTER_QUEUE_S = Knob(
    "max_cluster_queue_s",
    1.0,
    0.0,
    DAY_S,
    "max_cluster_queue_s",
    nullable=True,
    api_name="max_cluster_queue_seconds",
)

KNOBS: tuple[Knob, ...] = (
    MAX_SPEC_VRAM_FRACTION,
    MAX_BYTES_PER_INTERVAL,
    INTERVAL_S,
    MIN_CONFIDENCE,
    REPLICA_TTL_S,
    HORIZON_S,
    FORECAST_EVERY_S,
    PLAN_EVERY_S,
    HOLDOUT_FRACTION,
    MIN_BENEFIT_RATIO,
    MAX_QUEUE_S,
    MAX_CLUSTER_QUEUE_S,
)
BY_FIELD = {k.field: k for k in KNOBS}
BY_BUDGET: dict[str, Knob] = {k.budget: k for k in KNOBS if k.budget}


def budget_values(policy) -> dict[str, float]:
    """The ``Budgets`` fields of ``policy`` (a policy row, or anything with its fields as
    attributes): each knob's value under its budget's name, empty limits infinite. The one
    translation from a policy to the core's budgets (``types.Budgets.of``)."""
    out = {}
    for name, k in BY_BUDGET.items():
        value = getattr(policy, k.field)
        out[name] = math.inf if value is None else float(value)
    return out
