"""Workloads: real traces turned into request arrivals with canonical prefix chains."""
