"""What a simulation is given and what it returns: the cluster (``ClusterConfig``: engines, KV
capacity, links, tiers, engines that join or leave) and one run's result (``RunResult``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from controlplane.core.costmodel import CostModel
from controlplane.sim.workloads.base import BLOCK_TOKENS


@dataclass(frozen=True)
class TierSpec:
    name: str
    capacity_blocks: int
    bytes_per_s: float


@dataclass(frozen=True)
class EngineChange:
    """Engine ``eid`` is announced (starts warming) at ``announce_s`` and serves from
    ``serve_s``; or leaves at ``leave_s``."""

    eid: int
    announce_s: float = 0.0
    serve_s: float = 0.0
    leave_s: float = math.inf


@dataclass
class ClusterConfig:
    cost: CostModel
    engines: int
    kv_capacity_blocks: int
    engines_per_node: int = 1
    network_bytes_per_s: float = 25e9  # 200 Gb/s RDMA per engine
    link_latency_s: float = 0.005
    link_share_with_serving: float = 0.0
    # Ramp-in of joining engines (what an autoscaler's load balancer does with a new replica):
    # for ``join_ramp_s`` after an engine starts serving, a request goes to it whenever the
    # cache-aware choice's queue is longer than its queue by more than ``balance_wait_s``.
    # Off by default (Mooncake's Algorithm 1 is pure cost); ``scaleout`` turns it on so engines
    # that join take traffic as load rises instead of idling until warm queues exceed a recompute.
    balance_wait_s: float = math.inf
    join_ramp_s: float = 600.0
    tiers: tuple[TierSpec, ...] = ()
    changes: tuple[EngineChange, ...] = ()
    scenario: str = "steady"
    spec_fraction: float = 0.25  # speculative slice of a serving engine's KV cache
    warming_spec_fraction: float = 0.5  # of a joining engine's (warm-up copies)

    def __post_init__(self) -> None:
        for f in (self.spec_fraction, self.warming_spec_fraction):
            if not 0.0 <= f <= 1.0:
                raise ValueError("speculative fractions must be in [0, 1]")

    @property
    def block_bytes(self) -> int:
        return BLOCK_TOKENS * self.cost.kv_bytes_per_token

    def describe(self) -> dict:
        c = self.cost
        return {
            "scenario": self.scenario,
            "engines": self.engines,
            "model": c.model.name,
            "gpu": c.gpu.name,
            "gpus_per_engine": c.gpus,
            "kv_capacity_gb_per_engine": round(self.kv_capacity_blocks * self.block_bytes / 1e9, 2),
            "kv_capacity_blocks": self.kv_capacity_blocks,
            "block_tokens": BLOCK_TOKENS,
            "kv_bytes_per_token": c.kv_bytes_per_token,
            "engines_per_node": self.engines_per_node,
            "network_gbytes_per_s": self.network_bytes_per_s / 1e9,
            "nvlink_gbytes_per_s": c.gpu.nvlink_bytes_per_s * c.gpus / 1e9,
            "link_share_with_serving": self.link_share_with_serving,
            "balance_wait_s": None if math.isinf(self.balance_wait_s) else self.balance_wait_s,
            "join_ramp_s": self.join_ramp_s,
            "spec_fraction": self.spec_fraction,
            "warming_spec_fraction": self.warming_spec_fraction,
            "tiers": [
                {
                    "name": t.name,
                    "capacity_blocks": t.capacity_blocks,
                    "gbytes_per_s": t.bytes_per_s / 1e9,
                }
                for t in self.tiers
            ],
            "engine_changes": [
                {
                    "engine": f"e{c.eid}",
                    "announce_s": c.announce_s,
                    "serve_s": c.serve_s,
                    "leave_s": None if math.isinf(c.leave_s) else c.leave_s,
                }
                for c in self.changes
            ],
        }


@dataclass
class Replica:
    rid: int
    pid: int
    engine: int
    speculative: bool
    placed_at: float
    nbytes: float


@dataclass
class RunResult:
    policy: str
    ttft: np.ndarray
    cached_tokens: np.ndarray
    input_tokens: np.ndarray
    engine_of: np.ndarray
    bytes_moved: float
    spec_block_seconds: float
    replicas: list[Replica]
    replica_used: dict[int, bool]
    wall_s: float
    samples: list[dict] = field(default_factory=list)  # periodic VRAM/load samples
    forecasts: dict[str, list] = field(default_factory=dict)
    plan_items: int = 0
    arrivals: np.ndarray | None = None  # request arrival times (for the warm-up cut)
    backlog_s: float = 0.0  # mean queue of the serving engines when the last request arrived
    guard: dict = field(default_factory=dict)  # the harm guard's rounds, where the policy has one
    ingest: dict = field(default_factory=dict)  # the ingest re-plan's counts (core.policy.ingest)
    value: dict = field(default_factory=dict)  # modelled against measured (sim.valued)
