"""Replication decision rules shared by the simulator and the control plane."""
