"""What the planner and the scores charge and credit: the cost model of an engine's model, and
the promotion bandwidth of the slower tiers."""

from __future__ import annotations

from django.conf import settings

from controlplane.core.costmodel import MODELS, CostModel
from controlplane.core.protocol import TIER_CPU, TIER_DISK

# Promotion bandwidth from CPU DRAM (PCIe 5 x16, ~50 GB/s usable) and SSD (NVMe, ~6 GB/s).
TIER_BYTES_PER_S = {TIER_CPU: 50e9, TIER_DISK: 6e9}


def cost_model_for(model_name: str) -> CostModel:
    """The cost-model preset whose name the engine's model mentions, else the configured one."""
    low = model_name.lower()
    name = next(
        (n for n in sorted(MODELS, key=len, reverse=True) if n.split("-")[-1] in low),
        settings.PREWARM_DEFAULT_MODEL,
    )
    return CostModel.preset(name, settings.PREWARM_DEFAULT_GPU)
