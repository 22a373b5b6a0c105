"""Parsers for the real request traces in `shared/data/traces` (no Django).

`shared_data_dir()` locates the shared data folder the way CI lays it out (beside the checkout),
overridable with the `PREWARM_SHARED_DATA` environment variable.
"""
