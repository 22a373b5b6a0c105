"""What the planner and the scores charge and credit: the cost model of an engine's model, what a
replica saves and what placing it takes (the slower tiers' promotion bandwidth is
``core.costmodel.TIER_BYTES_PER_S``)."""

from __future__ import annotations

from django.conf import settings

from controlplane.core.costmodel import MODELS, CostModel
from wire.protocol import TRANSPORT_WARMUP


def cost_model_for(model_name: str) -> CostModel:
    """The cost-model preset whose name the engine's model mentions, else the configured one."""
    low = model_name.lower()
    name = next(
        (n for n in sorted(MODELS, key=len, reverse=True) if n.split("-")[-1] in low),
        settings.PREWARM_DEFAULT_MODEL,
    )
    return CostModel.preset(name, settings.PREWARM_DEFAULT_GPU)


def prefill_s(cm: CostModel, tokens: int, before: int = 0) -> float:
    """Compute time of prefilling ``tokens - before`` tokens after ``before`` cached ones: what
    a replica of ``tokens`` saves an engine that held ``before`` (no batch overhead: the
    request pays that either way)."""
    new = max(0, tokens - before)
    return max(0.0, cm.prefill_s(new, before) - cm.batch_overhead_s) if new else 0.0


def placement_cost(
    transport: str, nbytes: int, cm: CostModel, tokens: int, before: int = 0
) -> tuple[float, str]:
    """What placing a replica takes, and on what basis: a warm-up the target's prefill of the
    tokens it lacked (the cost model's: the executor reports no timing), a copy its bytes'
    time on the link (PREWARM_LINK_BYTES_PER_S)."""
    if transport == TRANSPORT_WARMUP:
        return prefill_s(cm, tokens, before), "warm-up prefill (cost model)"
    return nbytes / settings.PREWARM_LINK_BYTES_PER_S, "copy link time"
