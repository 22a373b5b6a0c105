"""The control plane's Prometheus registry and the series counted where they happen.

Counted in the web process that applies agent reports (reports applied and rejected, apply
latency, residency deltas) and holds agent sockets. Each web process exports its own; Prometheus
scrapes every one (``instance`` label) and ``sum``s them. The series read from the database at
scrape time, and the ``GET /api/metrics/`` view, are in ``controlplane/readmodels/metrics.py``
(they join apps; this module is plumbing every app may import).
"""

from __future__ import annotations

from prometheus_client import (
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
REGISTRY.register(PLATFORM_COLLECTOR)

REPORTS_APPLIED = Counter(
    "prewarm_reports_applied_total", "Agent reports applied", registry=REGISTRY
)
REPORTS_REJECTED = Counter(
    "prewarm_reports_rejected_total",
    "Agent reports refused, by error code",
    ["reason"],
    registry=REGISTRY,
)
REPORT_APPLY_SECONDS = Histogram(
    "prewarm_report_apply_seconds",
    "Time to validate and apply one agent report",
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
RESIDENCY_DELTAS = Counter(
    "prewarm_residency_deltas_total",
    "Block deltas (stored + removed) received in applied reports",
    registry=REGISTRY,
)
AGENT_SOCKETS = Gauge(
    "prewarm_agent_sockets", "Agent job websockets open on this web process", registry=REGISTRY
)


def report_applied(seconds: float, deltas: int) -> None:
    REPORTS_APPLIED.inc()
    REPORT_APPLY_SECONDS.observe(seconds)
    RESIDENCY_DELTAS.inc(deltas)


def report_rejected(reason: str) -> None:
    REPORTS_REJECTED.labels(reason or "error").inc()
