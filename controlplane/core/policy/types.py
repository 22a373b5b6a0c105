"""The policy's vocabulary: what callers tell the planner (candidates, demand, holdings, engine
states, budgets, overrides) and what it answers (``PlannedMove``). The budgets' defaults and
ranges are the policy's knobs (``knobs``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.core.policy import knobs
from controlplane.core.policy.value import ValueTerms
from wire.protocol import ENGINE_LIFECYCLES, ENGINE_SERVING, TIER_GPU

LIFECYCLES = ENGINE_LIFECYCLES


@dataclass(frozen=True)
class Candidate:
    """A prefix that could be replicated: its chain of canonical keys (root first)."""

    prefix_id: str
    keys: tuple[int, ...]
    tokens: int
    nbytes: int
    workload_key: str
    service_s: float  # prefill time of one request with the prefix cached
    recompute_s: float  # extra prefill time when the prefix is not cached


@dataclass(frozen=True)
class Demand:
    prefix_id: str
    expected_requests: float  # in the horizon
    burst_probability: float = 0.0
    peak_rate: float = 0.0  # requests/s a burst would reach
    confidence: float = 1.0
    first_arrival_s: float = 0.0  # seconds from now to the first expected request
    # Its two parts (``core.policy.demand``), for the plan summary: the rate measured now (or
    # a burst's onset), and the forecast's rate (0: no forecast).
    measured_rate: float = 0.0
    forecast_rate: float = 0.0


@dataclass(frozen=True)
class Holding:
    prefix_id: str
    engine_id: str
    tier: str = TIER_GPU  # protocol tier names: TIER_GPU, TIER_CPU, TIER_DISK


@dataclass(frozen=True)
class EngineState:
    engine_id: str
    node: str
    kv_capacity_bytes: float
    free_bytes: float  # room for speculative replicas: free + unreferenced cold blocks
    spec_bytes: float  # speculative replicas held now
    link_bytes_per_s: float  # effective, net of serving traffic
    load: float  # 0..1 utilisation (expected, for a warming engine)
    lifecycle: str = ENGINE_SERVING
    starts_serving_in_s: float = 0.0
    tier_bytes_per_s: dict[str, float] = field(default_factory=dict)  # promotion bandwidth
    link_queue_s: float = 0.0  # seconds of copies already queued on this engine's link
    # What a speculative item takes from the cluster where it lands (defaults: nothing known).
    queue_s: float = 0.0  # requests already queued on this engine: seconds until it frees up
    displaced_s_per_byte: float = 0.0  # expected prefill seconds the room in free_bytes holds


@dataclass(frozen=True)
class Budgets:
    """What bounds the planner. The policy's knobs (``knobs.KNOBS``: their defaults and ranges)
    and the planner's own settings; ``Budgets.of`` makes them from a policy."""

    max_spec_vram_fraction: float = knobs.MAX_SPEC_VRAM_FRACTION.budget_default
    max_bytes_per_interval: float = knobs.MAX_BYTES_PER_INTERVAL.budget_default
    min_confidence: float = knobs.MIN_CONFIDENCE.budget_default
    ttl_s: float = knobs.REPLICA_TTL_S.budget_default
    horizon_s: float = knobs.HORIZON_S.budget_default
    target_utilisation: float = 0.8
    copy_cost_weight: float = 1.0
    max_replicas_per_prefix: int = 64
    max_warming_fraction: float = 0.5
    max_load: float = 0.7  # no speculative item targets an engine busier than this
    # A replica (or warm-up copy) is planned only when at least this many requests are expected
    # to use it in the horizon: 1.6 makes P(used at least once) >= 0.8 for Poisson arrivals.
    min_expected_hits: float = 0.0
    # What speculation is charged (``knobs``: ``min_benefit_ratio``, ``max_queue_s``,
    # ``max_cluster_queue_s``): benefit must exceed cost x ``min_benefit_ratio``; no
    # speculative copy lands on a serving engine queueing longer than ``max_queue_s``, and none
    # at all (warm-ups of joining engines aside) while the serving engines queue
    # ``max_cluster_queue_s`` on average. Infinite: no limit.
    min_benefit_ratio: float = knobs.MIN_BENEFIT_RATIO.budget_default
    max_queue_s: float = knobs.MAX_QUEUE_S.budget_default
    max_cluster_queue_s: float = knobs.MAX_CLUSTER_QUEUE_S.budget_default

    def __post_init__(self) -> None:
        for name, knob in knobs.BY_BUDGET.items():
            if not knob.allows(getattr(self, name)):
                raise ValueError(f"{name} must be in [{knob.low:g}, {knob.high:g}]")
        if not 0.0 <= self.max_warming_fraction <= 1.0:
            raise ValueError("max_warming_fraction must be in [0, 1]")
        if not 0.0 < self.max_load <= 1.0:
            raise ValueError("max_load must be in (0, 1]")
        if not self.min_expected_hits >= 0.0:
            raise ValueError("min_expected_hits must be >= 0")

    @classmethod
    def of(cls, policy, **settings) -> Budgets:
        """The budgets of ``policy`` (a policy row, or anything with its fields as attributes;
        ``knobs.budget_values``), with ``settings`` (the planner's own fields) over them."""
        return cls(**{**knobs.budget_values(policy), **settings})

    def spec_cap_bytes(self, kv_capacity_bytes: float, allowance: float = 1.0) -> float:
        """The speculative bytes an engine of ``kv_capacity_bytes`` may hold: its slice
        (``max_spec_vram_fraction``), scaled by the harm guard's ``allowance``."""
        return allowance * self.max_spec_vram_fraction * kv_capacity_bytes


@dataclass(frozen=True)
class Overrides:
    pinned: frozenset[str] = frozenset()  # planned whatever their confidence
    excluded_engines: frozenset[str] = frozenset()
    excluded_nodes: frozenset[str] = frozenset()
    frozen: bool = False  # plan nothing


@dataclass(frozen=True)
class PlannedMove:
    prefix_id: str
    keys: tuple[int, ...]
    source: str  # engine id holding it (the target itself for a promotion)
    target: str
    tier: str  # the tier it comes from: TIER_GPU (a copy) or TIER_CPU/TIER_DISK (a promotion)
    nbytes: int
    start_in_s: float  # when to start, from now (ahead of the forecast burst)
    expected_ttft_saved_s: float
    cost_s: float
    confidence: float
    reason: str
    # The value model's terms, uncorrected (``core.policy.value``): ``expected_ttft_saved_s``
    # is their corrected value; the outcomes are measured against these.
    terms: ValueTerms | None = None
