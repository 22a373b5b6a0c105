"""Cost model: prefill, KV bytes and transfer times for a model on a GPU.

Pure arithmetic, no state. The simulator and the planner both price work with it, so the
numbers a plan promises and the numbers a simulated run delivers come from one place.

Prefill is compute bound: ``FLOPs = 2 * params * n + 4 * layers * d_model * n * (cached + n / 2)``
(dense matmuls plus causal attention over the already cached context and the new tokens), divided
by the engine's peak dense BF16 throughput times a model FLOPs utilisation (MFU), plus a fixed
per-batch overhead. Decode is memory bound: each step reads the weights once per batch and the KV
of every sequence in it. KV bytes per token = 2 (K and V) * layers * kv_heads * head_dim * dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wire.protocol import TIER_CPU, TIER_DISK


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer, as in its published config.json."""

    name: str
    params: float  # parameters
    layers: int
    d_model: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # BF16 weights and KV

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: memory, dense BF16 throughput, HBM bandwidth, interconnect."""

    name: str
    hbm_bytes: float
    bf16_flops: float  # dense, no sparsity
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per GPU, one direction


# Sources: the models' config.json on Hugging Face (meta-llama/Meta-Llama-3-8B and -70B):
# 8B: 32 layers, hidden 4096, 8 KV heads, head dim 128, 8.03e9 parameters;
# 70B: 80 layers, hidden 8192, 8 KV heads, head dim 128, 70.6e9 parameters.
MODELS: dict[str, ModelSpec] = {
    "llama3-8b": ModelSpec("llama3-8b", 8.03e9, 32, 4096, 8, 128),
    "llama3-70b": ModelSpec("llama3-70b", 70.6e9, 80, 8192, 8, 128),
}

# Sources: NVIDIA datasheets. A800 80GB SXM (the A100 export variant): 80 GB HBM2e, 312 TFLOPS
# dense BF16, 2,039 GB/s, NVLink 400 GB/s total (200 GB/s per direction). H100 SXM5 80GB:
# 989 TFLOPS dense BF16, 3.35 TB/s, NVLink 900 GB/s (450 per direction). H200 SXM 141GB:
# 989 TFLOPS dense BF16, 4.8 TB/s, NVLink 900 GB/s.
GPUS: dict[str, GpuSpec] = {
    "a800": GpuSpec("a800", 80e9, 312e12, 2.039e12, 200e9),
    "h100": GpuSpec("h100", 80e9, 989e12, 3.35e12, 450e9),
    "h200": GpuSpec("h200", 141e9, 989e12, 4.8e12, 450e9),
}

# Assumptions (printed in every report): long-prompt prefill reaches ~50% MFU on Hopper and
# Ampere with tensor parallelism (Mooncake and Splitwise report 40-60%); a batch costs ~20 ms of
# fixed overhead (scheduling, kernel launches, sampling).
PREFILL_MFU = 0.5
BATCH_OVERHEAD_S = 0.02
# Promotion bandwidth into HBM from the tiers below it, one figure for the planner and the simulator.
# CPU DRAM: PCIe 5.0 x16 (the H100/H200 host link) moves 64 GB/s per direction on the wire, ~50 GB/s
# host-to-device from pinned buffers (32 GB/s is PCIe 4.0 x16's wire rate, the A100's link). SSD:
# one NVMe Gen4 x4 drive, ~6 GB/s sequential read.
CPU_TIER_BYTES_PER_S = 50e9
DISK_TIER_BYTES_PER_S = 6e9
TIER_BYTES_PER_S = {TIER_CPU: CPU_TIER_BYTES_PER_S, TIER_DISK: DISK_TIER_BYTES_PER_S}
# Fraction of HBM left to the KV cache after weights (vLLM's gpu_memory_utilization 0.9 minus
# activations): the default KV capacity when the user gives none.
KV_MEMORY_FRACTION = 0.85


def lookup(table: dict, name: str, what: str):
    try:
        return table[name.lower()]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}") from None


@dataclass(frozen=True)
class CostModel:
    """Prices prefill and copies for one engine (a model on ``gpus`` GPUs)."""

    model: ModelSpec
    gpu: GpuSpec
    gpus: int = 1
    mfu: float = PREFILL_MFU
    batch_overhead_s: float = BATCH_OVERHEAD_S

    @classmethod
    def preset(cls, model: str, gpu: str, gpus: int | None = None) -> CostModel:
        m = lookup(MODELS, model, "model")
        g = lookup(GPUS, gpu, "GPU")  # not-vocabulary: the accelerator, not the tier
        return cls(m, g, gpus if gpus is not None else default_gpus(m, g))

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("gpus per engine must be >= 1")
        if self.model.weight_bytes >= self.gpus * self.gpu.hbm_bytes:
            raise ValueError(
                f"{self.model.name} weights ({self.model.weight_bytes / 1e9:.0f} GB) do not fit "
                f"on {self.gpus} x {self.gpu.name}"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    @property
    def flops_per_s(self) -> float:
        return self.gpus * self.gpu.bf16_flops * self.mfu

    def default_kv_capacity_bytes(self) -> float:
        total = self.gpus * self.gpu.hbm_bytes * KV_MEMORY_FRACTION
        return max(0.0, total - self.model.weight_bytes)

    def prefill_flops(self, new_tokens: float, cached_tokens: float = 0.0) -> float:
        m = self.model
        dense = 2.0 * m.params * new_tokens
        attention = 4.0 * m.layers * m.d_model * new_tokens * (cached_tokens + new_tokens / 2.0)
        return dense + attention

    def prefill_s(self, new_tokens: float, cached_tokens: float = 0.0) -> float:
        """Time to prefill ``new_tokens`` after ``cached_tokens`` already in the KV cache."""
        if new_tokens < 0 or cached_tokens < 0:
            raise ValueError("token counts must be >= 0")
        return self.batch_overhead_s + self.prefill_flops(new_tokens, cached_tokens) / (
            self.flops_per_s
        )

    def batch_prefill_s(self, requests: list[tuple[float, float]]) -> float:
        """One batch of (new, cached) prefills: the overhead once, the FLOPs summed."""
        flops = sum(self.prefill_flops(n, c) for n, c in requests)
        return self.batch_overhead_s + flops / self.flops_per_s

    def kv_bytes(self, tokens: float) -> float:
        return tokens * self.kv_bytes_per_token


def transfer_s(nbytes: float, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Time to move ``nbytes`` over a link of ``bytes_per_s`` (already net of sharing)."""
    if bytes_per_s <= 0:
        return math.inf
    return latency_s + nbytes / bytes_per_s


def default_gpus(model: ModelSpec, gpu: GpuSpec) -> int:
    """Smallest power-of-two tensor-parallel group whose weights use at most half the HBM."""
    n = 1
    while model.weight_bytes > 0.5 * n * gpu.hbm_bytes:
        n *= 2
    return n
