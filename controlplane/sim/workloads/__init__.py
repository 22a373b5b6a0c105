"""Workloads: real traces turned into request arrivals with canonical prefix chains."""

from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload, shared_data_dir

__all__ = ["BLOCK_TOKENS", "Workload", "shared_data_dir"]
