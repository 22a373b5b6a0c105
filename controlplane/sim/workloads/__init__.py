"""Workloads: real traces turned into request arrivals with canonical prefix chains."""

from controlplane.core.traces.paths import shared_data_dir
from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload

__all__ = ["BLOCK_TOKENS", "Workload", "shared_data_dir"]
