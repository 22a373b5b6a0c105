"""The control plane's Prometheus metrics, served at ``GET /api/metrics/`` (docs/deploy.md).

The registry and the counted series are in ``controlplane/metrics.py`` (plumbing); this read
model adds the series read from the database, which join fleet and replication.

Two kinds of series, so that they are right however many web and worker processes run:

- *Counted where it happens*, in the web process that applies agent reports (reports applied and
  rejected, apply latency, residency deltas) and holds agent sockets. Each web process exports its
  own; Prometheus scrapes every one (``instance`` label) and ``sum``s them. Workers count nothing,
  so Celery needs no multiprocess mode.
- *Read from the database at scrape time* (``StateCollector``): agents by state, the latest plan's
  cycle time and the speculation its harm guard allowed, plan items by decision, jobs by state and transport, bytes moved, live and shadow
  replicas, precision and the verdict. Every process reports the same values; take ``max``.

Metric names follow ``prewarm_<thing>_<unit>`` with few labels (docs/STYLE). The registry is
Prewarm's own (plus process and platform collectors), so nothing else a library registers leaks in.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Max, Sum
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily
from rest_framework.views import APIView

from controlplane.accounts.choices import Role
from controlplane.core import doctor
from controlplane.core.misses import HIT, REASONS
from controlplane.fleet.choices import NodeState
from controlplane.fleet.models import Node
from controlplane.metrics import REGISTRY
from controlplane.replication.choices import ItemDecision, JobState, Transport
from controlplane.replication.models import (
    PlanItem,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from controlplane.replication.scoreboard import scoreboard

from .doctor import findings as doctor_findings
from .misses import OTHER_TENANTS, top_tenants

log = logging.getLogger(__name__)
VERDICTS = ("insufficient_data", "reactive_enough", "speculation_pays")


class StateCollector:
    """Gauges computed from the database on every scrape (the same from any process)."""

    def describe(self):
        return []  # computed at scrape time: nothing to query when the collector is registered

    def collect(self):
        t0 = time.perf_counter()
        try:
            yield from self._collect()
        except Exception:  # a scrape must not 500 because one query failed; say so instead
            log.exception("metrics: reading the state from the database failed")
            up = GaugeMetricFamily("prewarm_state_up", "1 if the database state could be read")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("prewarm_state_up", "1 if the database state could be read")
        up.add_metric([], 1)
        yield up
        took = GaugeMetricFamily("prewarm_state_scrape_seconds", "Time to read the state gauges")
        took.add_metric([], time.perf_counter() - t0)
        yield took

    def _collect(self):
        now = timezone.now()
        yield self._agents()
        yield from self._latest_plan()
        yield self._plan_items(now)
        yield from self._jobs()
        yield self._replicas(now)
        yield from self._scores(now)
        yield from self._misses(now)
        yield from self._doctor()
        yield from self._last_scored()

    def _agents(self):
        nodes = GaugeMetricFamily(
            "prewarm_agents", "Enrolled agents (nodes) by state", labels=["state"]
        )
        counts = dict(Node.objects.values_list("state").annotate(n=Count("id")))
        for state, _ in NodeState.CHOICES:
            nodes.add_metric([state], counts.get(state, 0))
        return nodes

    def _latest_plan(self):
        """The latest plan cycle's time, when it was made and what its harm guard allowed."""
        latest = ReplicationPlan.objects.order_by("-created_at", "-id").first()
        cycle = GaugeMetricFamily(
            "prewarm_plan_cycle_seconds", "Gather + plan time of the latest plan cycle"
        )
        at = GaugeMetricFamily(
            "prewarm_plan_last_timestamp_seconds", "When the latest plan was made"
        )
        allowed = GaugeMetricFamily(
            "prewarm_plan_guard_allowed",
            "Speculation the harm guard allows in the latest plan: the lowest allowance of an "
            "engine or prefix group (1: full budget; its summary.guard.why says why)",
        )
        if latest is not None:
            cycle.add_metric([], float(latest.summary.get("planner_seconds") or 0.0))
            at.add_metric([], latest.created_at.timestamp())
            guard = latest.summary.get("guard") or {}
            if isinstance(guard.get("allowed"), int | float):
                allowed.add_metric([], float(guard["allowed"]))
        yield cycle
        yield at
        yield allowed

    def _plan_items(self, now):
        items = GaugeMetricFamily(
            "prewarm_plan_items",
            "Items of the plans made in the last hour, by decision",
            labels=["decision"],
        )
        counts = dict(
            PlanItem.objects.filter(plan__created_at__gte=now - timedelta(hours=1))
            .values_list("decision")
            .annotate(n=Count("id"))
        )
        for decision, _ in ItemDecision.CHOICES:
            items.add_metric([decision], counts.get(decision, 0))
        return items

    def _jobs(self):
        """Jobs on record by state and transport, and the bytes moved by the finished ones."""
        jobs = GaugeMetricFamily(
            "prewarm_jobs",
            "Replication jobs on record by state and transport",
            labels=["state", "transport"],
        )
        moved = GaugeMetricFamily(
            "prewarm_moved_bytes",
            "Bytes moved by replication jobs on record whose executor did its part (landed, confirmed, "
            "unconfirmed, lost, succeeded; PREWARM_JOB_KEEP_DAYS), by transport",
            labels=["transport"],
        )
        rows = {
            (r["state"], r["transport"]): r
            for r in ReplicationJob.objects.values("state", "transport").annotate(
                n=Count("id"), b=Sum("bytes_done")
            )
        }
        for transport, _ in Transport.CHOICES:
            for state, _ in JobState.CHOICES:
                jobs.add_metric(
                    [state, transport], (rows.get((state, transport)) or {}).get("n", 0)
                )
            moved.add_metric(
                [transport],
                sum((rows.get((state, transport)) or {}).get("b") or 0 for state in JobState.DONE),
            )
        yield jobs
        yield moved

    def _replicas(self, now):
        replicas = GaugeMetricFamily(
            "prewarm_replicas",
            "Speculative replicas in place (not evicted or expired)",
            labels=["kind"],
        )
        held = dict(
            SpeculativeReplica.objects.filter(evicted_at__isnull=True, expires_at__gt=now)
            .values_list("shadow")
            .annotate(n=Count("id"))
        )
        replicas.add_metric(["live"], held.get(False, 0))
        replicas.add_metric(["shadow"], held.get(True, 0))
        return replicas

    def _scores(self, now):
        """The scoreboard's precision, hits and verdict (live and shadow replicas)."""
        board = scoreboard(until=now)
        precision = GaugeMetricFamily(
            "prewarm_replica_precision",
            "Share of scored replicas (last 7 days) hit at least once; absent until one is scored",
            labels=["kind"],
        )
        for kind, block in (("live", board["totals"]), ("shadow", board["shadow_totals"])):
            if block["precision"] is not None:
                precision.add_metric([kind], block["precision"])
        yield precision
        scored = GaugeMetricFamily(
            "prewarm_replica_hits", "Hits on replicas placed in the last 7 days", labels=["kind"]
        )
        scored.add_metric(["live"], board["totals"]["hits"])
        scored.add_metric(["shadow"], board["shadow_totals"]["hits"])
        yield scored
        verdict = GaugeMetricFamily(
            "prewarm_verdict", "The scoreboard's verdict: 1 for the current one", labels=["verdict"]
        )
        current = board["recommendation"]["verdict"]
        for v in VERDICTS:
            verdict.add_metric([v], 1 if v == current else 0)
        yield verdict

    def _misses(self, now):
        """Served requests of the last hour by reason and hit rates, for the top tenants (by
        served requests) and ``other``: the label's cardinality is bounded whatever the tenants."""
        top, rest = top_tenants(now - timedelta(hours=1), settings.PREWARM_METRICS_TOP_TENANTS)
        rows = [(t["tenant"], t) for t in top] + ([(OTHER_TENANTS, rest)] if rest else [])
        served = GaugeMetricFamily(
            "prewarm_served_requests",
            "Served requests of the last hour by the reason decided at ingest (top tenants + other)",
            labels=["tenant", "reason"],
        )
        rate = GaugeMetricFamily(
            "prewarm_hit_rate",
            "Hit rate of the last hour's served requests: delivered, and at the speed of light "
            "(each request on the engine holding its longest prefix); top tenants + other",
            labels=["tenant", "kind"],
        )
        for tenant, c in rows:
            n = sum(c.get(r, 0) for r in REASONS)
            for r in REASONS:
                served.add_metric([tenant, r], c.get(r, 0))
            if n:
                rate.add_metric([tenant, "delivered"], c.get(HIT, 0) / n)
                rate.add_metric([tenant, "speed_of_light"], c.get("sol_hits", 0) / n)
        yield served
        yield rate

    def _doctor(self):
        found = Counter(f.check for f in doctor_findings())
        series = GaugeMetricFamily(
            "prewarm_doctor_findings",
            "Fleet doctor findings now, by check (0: healthy; docs/deploy.md, Troubleshooting "
            "KV-aware routing)",
            labels=["check"],
        )
        for check in doctor.CHECKS:
            series.add_metric([check], found.get(check, 0))
        yield series

    def _last_scored(self):
        newest = SpeculativeReplica.objects.aggregate(at=Max("scored_at"))["at"]
        if newest is not None:
            last = GaugeMetricFamily(
                "prewarm_score_last_timestamp_seconds", "When a replica was last scored"
            )
            last.add_metric([], newest.timestamp())
            yield last


REGISTRY.register(StateCollector())


class MetricsView(APIView):
    """Prometheus text exposition of the control plane's series (docs/deploy.md, scrape config).

    Protected like the rest of the API: a viewer's session or a user token (``pwu_``) of a
    viewer or above; agent and gateway tokens are refused.
    """

    read_role = Role.VIEWER

    @extend_schema(
        tags=["metrics"],
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="Prometheus text format"
            )
        },
    )
    def get(self, request):
        return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
