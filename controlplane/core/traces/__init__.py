"""Parsers for the real request traces in `shared/data/traces` (no Django).

`shared_data_dir()` locates the shared data folder the way CI lays it out (beside the checkout),
overridable with the `PREWARM_SHARED_DATA` environment variable.
"""

from controlplane.core.traces.paths import shared_data_dir
from controlplane.core.traces.servegen import (
    SERVEGEN_M_LARGE,
    ServegenTenant,
    load_servegen_windows,
)

__all__ = ["SERVEGEN_M_LARGE", "ServegenTenant", "load_servegen_windows", "shared_data_dir"]
