"""Prewarm control plane.

Importing this package must not import Django: the pure-logic packages under it
(`controlplane.core`, `controlplane.sim`) are used by the simulator, the benchmarks and the
node agent without Django installed or configured.
"""
