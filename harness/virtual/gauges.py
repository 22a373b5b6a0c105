"""What the agents read from the virtual nodes: their GPUs (as the agent's ``simulated`` GPU
source polls them) and each engine's ``/metrics`` (running, waiting, KV usage, prefix-cache
queries and hits), refreshed by the cluster's loop.

A virtual GPU's memory in use is the engine's weights plus the KV blocks its cache holds now,
both split over the engine's GPUs: it rises as the cache fills and falls when blocks leave.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from controlplane.sim.engine import PLANNED, SERVING

if TYPE_CHECKING:
    from controlplane.core.costmodel import CostModel
    from harness.virtual.endpoints import Endpoints
    from harness.virtual.engine import VirtualEngine

UTIL_WINDOW_S = 30.0  # sim seconds over which engine utilisation (kv_usage) is averaged


class Gauges:
    def __init__(
        self,
        engines: list[VirtualEngine],
        http: Endpoints,
        cost: CostModel,
        block_bytes: int,
        model: str,
        node_name,
    ):
        self.engines, self.http, self.cost = engines, http, cost
        self.block_bytes, self.model, self.node_name = block_bytes, model, node_name
        n = len(engines)
        self.util = [0.0] * n
        self._busy_seen = [0.0] * n
        self._util_t = 0.0
        self.queries = [0] * n  # prompt tokens asked of each engine (requests and warm-ups)
        self.hits = [0] * n  # of which found in its cache

    def gpu_memory_used(self, ve: VirtualEngine) -> int:
        """Bytes in use on each of the engine's GPUs: weights and the KV blocks held now."""
        if ve.sim.state == PLANNED:
            return 0
        held = len(ve.sim.cache) * self.block_bytes
        used = (self.cost.model.weight_bytes + held) / self.cost.gpus
        return int(min(self.cost.gpu.hbm_bytes, used))

    def publish(self, now: float) -> None:
        cost, gpu = self.cost, self.cost.gpu
        dt = now - self._util_t
        for ve in self.engines:
            e = ve.sim
            i = e.eid
            if dt > 0:
                inst = min(1.0, (e.busy_s - self._busy_seen[i]) / dt)
                a = 1.0 - math.exp(-dt / UTIL_WINDOW_S)
                self.util[i] += a * (inst - self.util[i])
                self._busy_seen[i] = e.busy_s
            util = self.util[i]
            node = self.node_name(i)
            running = e.state == SERVING and e.free_at > now
            used = self.gpu_memory_used(ve)
            gpus = [
                {
                    "uuid": f"GPU-{node}-{g}",
                    "index": g,
                    "name": f"{gpu.name.upper()} (virtual)",
                    "memory_total": int(gpu.hbm_bytes),
                    "memory_used": used,
                    "utilization_gpu": round(100 * util),
                    "nvlink_peers": [],
                    "processes": [],
                }
                for g in range(cost.gpus)
            ]
            self.http.set_gpus(
                node, {"gpus": gpus, "status": f"{cost.gpus} virtual GPU(s), engine {e.state}"}
            )
            mean_service = (e.busy_s / e.served) if e.served else 1.0
            waiting = max(0, math.ceil(e.wait(now) / mean_service) - 1) if running else 0
            self.http.set_metrics(
                ve.engine_id,
                {
                    "running": 1 if running else 0,
                    "waiting": waiting,
                    "kv_usage": round(util, 4),
                    "queries": self.queries[i],
                    "hits": self.hits[i],
                },
                self.model,
            )
        if dt > 0:
            self._util_t = now
