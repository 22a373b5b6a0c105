"""The replication planner: what to copy where, and why. It lives with the rest of the one
policy in ``controlplane.core.policy.planner`` (its module doc has the benefit model); this
module keeps the name the Celery cycle, the simulator and the benchmarks import, re-exporting
exactly that module's public names."""

from controlplane.core.policy.planner import *  # noqa: F403
from controlplane.core.policy.planner import __all__ as __all__
