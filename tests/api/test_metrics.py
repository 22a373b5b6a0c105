"""``GET /api/metrics/``: Prometheus text with Prewarm's own series, counted where they happen
(reports in the web process) or read from the database at scrape time (jobs, replicas, verdict)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.fleet.models import Engine
from controlplane.replication.models import (
    PlanItem,
    Policy,
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)

from .helpers import report


def scrape(client) -> dict[tuple[str, tuple], float]:
    resp = client.get("/api/metrics/")
    assert resp.status_code == 200, resp.content[:300]
    assert resp["Content-Type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(resp.content.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def viewer(client_for):
    return client_for("viewer")


def test_report_counters_move_with_applied_and_rejected_reports(enrol, viewer):
    before = scrape(viewer)
    _, agent = enrol("node-a")
    stored = [("0a", None, "GPU", 0), ("0b", "0a", "GPU", 0)]
    assert (
        agent.post(
            "/api/agents/report/", report(1, stored=stored, mode="snapshot"), format="json"
        ).status_code
        == 200
    )
    assert (
        agent.post("/api/agents/report/", report(1), format="json").status_code == 409
    )  # stale seq
    assert agent.post("/api/agents/report/", {"seq": "x"}, format="json").status_code == 400
    after = scrape(viewer)
    assert (
        value(after, "prewarm_reports_applied_total")
        == value(before, "prewarm_reports_applied_total") + 1
    )
    for reason in ("stale_seq", "invalid_report"):
        assert (
            value(after, "prewarm_reports_rejected_total", reason=reason)
            == value(before, "prewarm_reports_rejected_total", reason=reason) + 1
        )
    assert (
        value(after, "prewarm_report_apply_seconds_count")
        == value(before, "prewarm_report_apply_seconds_count") + 1
    )
    assert (
        value(after, "prewarm_residency_deltas_total")
        == value(before, "prewarm_residency_deltas_total") + 2
    )
    assert value(after, "prewarm_agents", state="active") == 1
    assert value(after, "prewarm_state_up") == 1


def test_state_gauges_read_jobs_plans_replicas_and_the_verdict(enrol, viewer):
    _, agent = enrol("node-a")
    agent.post("/api/agents/report/", report(1), format="json")
    engine = Engine.objects.get()
    policy = Policy.objects.get(active=True)
    plan = ReplicationPlan.objects.create(
        policy=policy, mode="auto", summary={"planner_seconds": 0.25}
    )
    item = PlanItem.objects.create(
        plan=plan,
        prefix_keys=["01"],
        target=engine,
        bytes=1,
        expected_ttft_saved_s=1,
        cost_s=0.1,
        confidence=0.9,
        reason="t",
        decision="approved",
    )
    ReplicationJob.objects.create(
        item=item,
        prefix_keys=["01"],
        target=engine,
        state="succeeded",
        transport="tcp",
        bytes=4096,
        bytes_done=4096,
    )
    ReplicationJob.objects.create(
        prefix_keys=["01"], target=engine, state="failed", transport="nccl"
    )
    now = timezone.now()
    SpeculativeReplica.objects.create(
        engine=engine,
        prefix_keys=["01"],
        bytes=4096,
        shadow=False,
        placed_at=now,
        expires_at=now + timedelta(minutes=5),
        hits=2,
        scored_at=now,
    )
    SpeculativeReplica.objects.create(
        engine=engine,
        prefix_keys=["01"],
        bytes=4096,
        shadow=True,
        placed_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    m = scrape(viewer)
    assert value(m, "prewarm_plan_cycle_seconds") == 0.25
    assert value(m, "prewarm_plan_items", decision="approved") == 1
    assert value(m, "prewarm_jobs", state="succeeded", transport="tcp") == 1
    assert value(m, "prewarm_jobs", state="failed", transport="nccl") == 1
    assert value(m, "prewarm_moved_bytes", transport="tcp") == 4096
    assert (
        value(m, "prewarm_replicas", kind="live") == 1
        and value(m, "prewarm_replicas", kind="shadow") == 1
    )
    assert value(m, "prewarm_replica_precision", kind="live") == 1.0
    assert ("prewarm_replica_precision", (("kind", "shadow"),)) not in m  # nothing scored yet
    assert value(m, "prewarm_verdict", verdict="insufficient_data") == 1
    assert (
        sum(
            value(m, "prewarm_verdict", verdict=v)
            for v in ("insufficient_data", "reactive_enough", "speculation_pays")
        )
        == 1
    )


def test_agent_and_gateway_tokens_cannot_scrape(enrol, gateway, client_for):
    _, agent = enrol("node-a")
    assert agent.get("/api/metrics/").status_code == 403
    assert gateway.get("/api/metrics/").status_code == 403
    assert client_for("anonymous").get("/api/metrics/").status_code in (401, 403)


def test_a_scraping_token_from_ensure_user_reads_metrics_as_a_viewer(db):
    from io import StringIO

    from django.core.management import call_command

    from .conftest import bearer

    out = StringIO()
    call_command(
        "ensure_user",
        "prometheus",
        "--password",
        "pw-123456789",
        "--role",
        "viewer",
        "--issue-token",
        "prometheus",
        stdout=out,
    )
    raw = out.getvalue().strip().splitlines()[-1]
    assert raw.startswith("pwu_")
    assert bearer(raw).get("/api/metrics/").status_code == 200
    assert (
        bearer(raw)
        .post("/api/overrides/", {"kind": "freeze", "reason": "x"}, format="json")
        .status_code
        == 403
    )


def test_the_grafana_dashboard_uses_only_series_the_endpoint_serves(enrol, viewer):
    import json
    import re
    from pathlib import Path

    _, agent = enrol("node-a")
    agent.post("/api/agents/report/", report(1), format="json")
    text = viewer.get("/api/metrics/").content.decode()
    # family names (announced even before a first sample) with their sample suffixes
    served = {
        f.name + sfx
        for f in text_string_to_metric_families(text)
        for sfx in ("", "_total", "_bucket", "_count", "_sum")
    }
    doc = json.loads(
        (Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text()
    )
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    used = {n for e in exprs for n in re.findall(r"\b(prewarm_[a-z_]+|process_[a-z_]+)", e)}
    missing = used - served
    assert used and not missing, missing


def test_miss_series_keep_the_top_tenants_and_sum_the_rest_as_other(
    enrol, gateway, viewer, settings
):
    import time

    settings.PREWARM_METRICS_TOP_TENANTS = 2
    _, agent = enrol("node-a")
    stored = [("0a", None, "GPU", 0), ("0b", "0a", "GPU", 0)]
    agent.post("/api/agents/report/", report(1, stored=stored, mode="snapshot"), format="json")
    engine = Engine.objects.get()
    now = time.time()
    records = []
    # t1: 3 hits; t2: 2 cold (another chain); t3 and t4: 1 hit each -> "other" = 2 hits.
    for tenant, n, keys, cached in (
        ("t1", 3, ["0a", "0b"], 32),
        ("t2", 2, ["0c"], 0),
        ("t3", 1, ["0a", "0b"], 32),
        ("t4", 1, ["0a", "0b"], 32),
    ):
        records += [
            {
                "time": now,
                "model": "m",
                "tenant": tenant,
                "keys": keys,
                "cached_tokens": cached,
                "engine": str(engine.pk),
            }
        ] * n
    resp = gateway.post("/api/request-records/", {"records": records}, format="json")
    assert resp.status_code == 200, resp.content
    samples = scrape(viewer)
    tenants = {dict(k[1])["tenant"] for k in samples if k[0] == "prewarm_served_requests"}
    assert tenants == {"t1", "t2", "other"}
    assert value(samples, "prewarm_served_requests", tenant="t1", reason="hit") == 3
    assert value(samples, "prewarm_served_requests", tenant="t2", reason="cold") == 2
    assert value(samples, "prewarm_served_requests", tenant="other", reason="hit") == 2
    assert value(samples, "prewarm_hit_rate", tenant="t2", kind="delivered") == 0.0
    assert value(samples, "prewarm_hit_rate", tenant="t1", kind="speed_of_light") == 1.0
