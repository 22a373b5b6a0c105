"""Helpers of bench/load.py (simulated agents, gateways and dashboards against real servers)."""
