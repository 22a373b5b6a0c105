"""The workflow in one process (tasks eager, on commit): a recorded burst -> forecast -> plan ->
approval by policy mode -> jobs -> agents' events -> replica in residency -> score."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.demand.models import WorkloadKey
from controlplane.fleet.configured_index import get_index
from controlplane.fleet.models import Engine, Node
from controlplane.forecasting.models import Forecast
from controlplane.replication.choices import JobState, PlanState
from controlplane.replication.models import (
    ReplicationJob,
    ReplicationPlan,
    SpeculativeReplica,
)
from controlplane.replication.tasks import (
    evict_expired,
    forecast_then_plan,
    plan_cycle,
    score_replicas,
    sweep_jobs,
)
from harness import burst
from wire import blockhash


def run_cycle(fleet, mode, **policy):
    p = fleet.policy(mode, **policy)
    fleet.post_burst(time.time())
    forecast_then_plan(p)
    return p, ReplicationPlan.objects.filter(policy=p).first()


def finish(fleet, job, ok=True):
    """Both agents report the job as a real agent would (ack, then result)."""
    names = {v: k for k, v in fleet.nodes.items()}
    for engine in (job.source, job.target):
        agent = fleet.agents[names[engine.node_id]]
        r = agent.post(
            f"/api/agents/jobs/{job.pk}/events/",
            {"type": "job.ack", "job_id": str(job.pk)},
            format="json",
        )
        assert r.status_code == 200, r.content
        r = agent.post(
            f"/api/agents/jobs/{job.pk}/events/",
            {
                "type": "job.result",
                "job_id": str(job.pk),
                "state": "succeeded" if ok else "failed",
                "checksum": "ab" * 32,
                "bytes": job.bytes,
                "error": None if ok else "disk full",
            },
            format="json",
        )
        assert r.status_code == 200, r.content
    job.refresh_from_db()
    return job


def test_auto_mode_burst_to_forecast_plan_job_residency_and_score(fleet):
    policy, plan = run_cycle(fleet, "auto")
    f = Forecast.objects.get()
    assert f.model and len(f.yhat) == 5 and f.burst_risk is not None
    assert "baseline only" in f.note  # 5 minutes of history: too little to backtest Prophet
    assert plan is not None and plan.items.exists(), plan.summary
    item = plan.items.first()
    assert item.source.node.name == "node-a" and item.target.node.name in ("node-b", "node-c")
    assert (
        item.reason and item.expected_ttft_saved_s > 0 and item.bytes == len(burst.PREFIX) * 65536
    )
    job = ReplicationJob.objects.get(item=item)
    assert job.state == JobState.DISPATCHED and job.attempt == 1
    # The long-poll gives the target its assignment, as docs/agent-protocol.md says.
    names = {v: k for k, v in fleet.nodes.items()}
    got = fleet.agents[names[item.target.node_id]].get("/api/agents/jobs/?wait=0").json()
    assert [m["job"]["role"] for m in got if m["job"]["id"] == str(job.pk)] == ["target"]
    job = finish(fleet, job)
    assert job.state == JobState.LANDED
    assert [t.to_state for t in job.transitions.all()] == [
        "approved",
        "dispatched",
        "running",
        "landed",
    ]
    # Landed is not resident: nothing routes to the copy until the target engine shows it.
    holders = {h.engine for h in get_index().holders(burst.PREFIX) if h.depth == len(burst.PREFIX)}
    assert item.target_id not in holders
    replica = SpeculativeReplica.objects.get(job=job)
    assert not replica.shadow and replica.status == "landed" and replica.bytes_moved == job.bytes
    lookup = fleet.gateway.post(
        "/api/residency/lookup/",
        {"keys": [blockhash.to_hex(k) for k in burst.PREFIX]},
        format="json",
    ).json()
    assert item.target_id not in {h["engine"] for h in lookup["holders"]}
    # Another engine computing the prefix (its agent's report, then its eviction) proves
    # nothing about this copy: only the target's own events can confirm it.
    other = next(n for n in ("node-b", "node-c") if fleet.nodes[n] != item.target.node_id)
    fleet.report(other, burst.PREFIX, seq=2)
    fleet.report(other, (), seq=3)
    job.refresh_from_db()
    assert job.state == JobState.LANDED and not job.stored_since
    # The target's agent reports its engine's KV events: the copy is confirmed by them when
    # that report is applied (no sweep runs here).
    fleet.report(names[item.target.node_id], burst.PREFIX)
    job.refresh_from_db()
    replica.refresh_from_db()
    assert job.state == JobState.CONFIRMED and replica.status == "confirmed"
    assert replica.confirmed_by == "kv-events"
    holders = {h.engine for h in get_index().holders(burst.PREFIX) if h.depth == len(burst.PREFIX)}
    assert item.target_id in holders
    # Demand keeps arriving after placement: the replica's share of it are its hits.
    fleet.post_burst(time.time() + 120)
    SpeculativeReplica.objects.filter(pk=replica.pk).update(
        placed_at=replica.placed_at - timedelta(minutes=10)
    )
    score_replicas.delay()
    replica.refresh_from_db()
    assert replica.hits > 0 and replica.ttft_saved_s > 0 and replica.vram_byte_seconds > 0
    board = fleet.operator.get("/api/scoreboard/?since=1999-01-01T00:00:00Z").json()
    assert board["totals"]["replicas"] >= 1 and board["totals"]["hits"] == replica.hits
    assert (
        board["by_policy"][0]["policy"] == policy.name and board["by_policy"][0]["mode"] == "auto"
    )
    assert board["by_tenant"][0]["tenant"] == burst.TENANT
    assert board["recommendation"]["verdict"] == "insufficient_data"
    # These engines report no GPU: the cluster cannot be placed on the simulator's map.
    assert board["recommendation"]["prior"] is None
    assert "cannot be placed on the simulator's map" in board["recommendation"]["text"]
    assert AuditEvent.objects.filter(action="plan.approved", object_id=str(plan.pk)).exists()


def test_shadow_mode_moves_nothing_and_is_scored_as_if_executed(fleet):
    _, plan = run_cycle(fleet, "shadow")
    assert plan.state == PlanState.SHADOW and plan.items.exists()
    assert not ReplicationJob.objects.exists()
    assert SpeculativeReplica.objects.filter(shadow=True).count() == plan.items.count()
    r = fleet.operator.post(f"/api/plans/{plan.pk}/approve/", {}, format="json")
    assert r.status_code == 200 and all("shadow" in v for v in r.json()["refused"].values())
    assert not ReplicationJob.objects.exists()
    score_replicas.delay()
    board = fleet.operator.get("/api/scoreboard/").json()
    assert (
        board["shadow_totals"]["replicas"] == plan.items.count()
        and board["totals"]["replicas"] == 0
    )


def test_manual_mode_approval_bad_approvals_refused_and_cancel(fleet):
    policy, plan = run_cycle(fleet, "manual")
    assert plan.state == PlanState.PROPOSED and not ReplicationJob.objects.exists()
    items = list(plan.items.all())
    assert items
    # A stale target node is refused with the reason, and nothing changes.
    stale = items[0]
    Node.objects.filter(pk=stale.target.node_id).update(state="stale")
    r = fleet.operator.post(f"/api/plans/{plan.pk}/approve/", {"items": [stale.pk]}, format="json")
    assert r.status_code == 200 and "stale" in r.json()["refused"][str(stale.pk)]
    assert not ReplicationJob.objects.exists()
    stale.refresh_from_db()
    assert stale.decision == "pending"
    Node.objects.filter(pk=stale.target.node_id).update(state="active")
    # A budget the item now breaks is refused too.
    policy.max_bytes_per_interval = 1
    policy.save()
    r = fleet.operator.post(f"/api/plans/{plan.pk}/approve/", {"items": [stale.pk]}, format="json")
    assert "transfer budget" in r.json()["refused"][str(stale.pk)]
    assert not ReplicationJob.objects.exists()
    policy.max_bytes_per_interval = 10**15
    policy.save()
    # A viewer may not approve at all.
    viewer = fleet.operator.__class__()
    from tests.api.conftest import make_user

    viewer.force_authenticate(make_user("viewer", "v"))
    assert viewer.post(f"/api/plans/{plan.pk}/approve/", {}, format="json").status_code == 403
    # Approving works, and approving twice is harmless.
    r = fleet.operator.post(f"/api/plans/{plan.pk}/approve/", {"items": [stale.pk]}, format="json")
    assert r.json()["refused"] == {}
    again = fleet.operator.post(
        f"/api/plans/{plan.pk}/approve/", {"items": [stale.pk]}, format="json"
    )
    assert again.json()["refused"] == {} and ReplicationJob.objects.count() == 1
    job = ReplicationJob.objects.get()
    assert job.state == JobState.DISPATCHED
    # Cancelling works at any step before success, and late agent events change nothing.
    r = fleet.operator.post(
        f"/api/replication-jobs/{job.pk}/cancel/", {"reason": "test"}, format="json"
    )
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    finish(fleet, job)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and not SpeculativeReplica.objects.exists()


@pytest.mark.parametrize("kind", ["freeze", "exclude_node"])
def test_overrides_win_over_plans(fleet, kind):
    body = {"kind": kind, "reason": "maintenance"}
    if kind == "exclude_node":
        body["node"] = fleet.nodes["node-b"]
    assert fleet.operator.post("/api/overrides/", body, format="json").status_code == 201
    _, plan = run_cycle(fleet, "auto")
    targets = {i.target.node.name for i in plan.items.all()}
    if kind == "freeze":
        assert not plan.items.exists() and plan.summary["frozen"]
    else:
        assert targets and "node-b" not in targets


def test_pin_override_plans_a_copy_to_the_pinned_engine(fleet):
    target = Engine.objects.get(node__name="node-c")
    keys = [blockhash.to_hex(k) for k in burst.PREFIX]
    r = fleet.operator.post(
        "/api/overrides/",
        {"kind": "pin", "engine": target.pk, "prefix_keys": keys, "reason": "launch day"},
        format="json",
    )
    assert r.status_code == 201
    fleet.policy("manual")
    plan_cycle.delay()
    plan = ReplicationPlan.objects.get()
    assert plan.items.filter(target=target, reason__startswith="pinned").exists()


def test_failed_job_retries_with_backoff_then_expires_when_agent_is_gone(fleet, settings):
    settings.PREWARM_JOB_BACKOFF_SECONDS = 0.0
    _, plan = run_cycle(fleet, "auto")
    job = ReplicationJob.objects.filter(item__plan=plan).first()
    names = {v: k for k, v in fleet.nodes.items()}
    source = fleet.agents[names[job.source.node_id]]
    for msg in (
        {"type": "job.ack"},
        {"type": "job.result", "state": "failed", "error": "disk full"},
    ):
        assert (
            source.post(f"/api/agents/jobs/{job.pk}/events/", msg, format="json").status_code == 200
        )
    job.refresh_from_db()
    assert job.state == JobState.DISPATCHED and job.attempt == 2  # retried (eager, zero backoff)
    assert "disk full" in job.error
    Node.objects.filter(pk=job.target.node_id).update(state="stale")
    sweep_jobs.delay()
    job.refresh_from_db()
    assert job.state == JobState.EXPIRED
    assert job.error == "agent of the target is gone"  # says why, not the earlier attempt's error


def _job_via_api(fleet, job) -> dict:
    resp = fleet.operator.get(f"/api/replication-jobs/{job.pk}/")
    assert resp.status_code == 200
    return resp.json()


def test_a_job_whose_deadline_passes_says_in_which_state(fleet):
    _, plan = run_cycle(fleet, "auto")
    job = ReplicationJob.objects.filter(item__plan=plan).first()
    names = {v: k for k, v in fleet.nodes.items()}
    target = fleet.agents[names[job.target.node_id]]
    assert (
        target.post(
            f"/api/agents/jobs/{job.pk}/events/", {"type": "job.ack"}, format="json"
        ).status_code
        == 200
    )
    target.post(
        f"/api/agents/jobs/{job.pk}/events/",
        {"type": "job.progress", "bytes_done": 1024},
        format="json",
    )
    ReplicationJob.objects.filter(pk=job.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    sweep_jobs.delay()
    job.refresh_from_db()
    want = f"deadline passed while running (attempt 1), 1024 of {job.bytes} bytes copied"
    assert job.state == JobState.EXPIRED and job.error == want
    assert _job_via_api(fleet, job)["error"] == want
    from django.contrib.auth.models import User
    from django.test import Client

    browser = Client()
    browser.force_login(User.objects.get(username="op"))
    page = browser.get("/jobs/?state=expired")
    assert page.status_code == 200 and want in page.content.decode()  # the Error column


def test_a_checksum_mismatch_fails_the_attempt_and_says_so(fleet, settings):
    settings.PREWARM_JOB_MAX_ATTEMPTS = 1
    _, plan = run_cycle(fleet, "auto")
    job = ReplicationJob.objects.filter(item__plan=plan).first()
    ReplicationJob.objects.filter(pk=job.pk).update(max_attempts=1)
    names = {v: k for k, v in fleet.nodes.items()}
    for engine, checksum in ((job.source, "ab" * 32), (job.target, "cd" * 32)):
        agent = fleet.agents[names[engine.node_id]]
        for msg in (
            {"type": "job.ack"},
            {"type": "job.result", "state": "succeeded", "checksum": checksum, "bytes": job.bytes},
        ):
            assert (
                agent.post(f"/api/agents/jobs/{job.pk}/events/", msg, format="json").status_code
                == 200
            )
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert _job_via_api(fleet, job)["error"] == "target checksum differs from the source's"


def test_warming_engine_is_prewarmed_and_reports_readiness(fleet):
    warming = Engine.objects.get(node__name="node-c")
    r = fleet.operator.post(
        f"/api/engines/{warming.pk}/lifecycle/", {"lifecycle": "draining"}, format="json"
    )
    assert r.status_code == 200
    Engine.objects.filter(pk=warming.pk).update(lifecycle="warming")
    _, plan = run_cycle(fleet, "manual")
    warming.refresh_from_db()
    planned = plan.items.filter(target=warming)
    assert planned.exists()  # the joining engine gets the hot prefix before it takes traffic
    assert warming.readiness == 0.0


def test_copy_the_engine_never_shows_is_unconfirmed_for_good(fleet, settings):
    _, plan = run_cycle(fleet, "auto")
    jobs = list(ReplicationJob.objects.filter(item__plan=plan))
    names = {v: k for k, v in fleet.nodes.items()}
    job = finish(fleet, jobs[0])
    assert job.state == JobState.LANDED
    settings.PREWARM_REPLICA_CONFIRM_SECONDS = 0.0
    sweep_jobs.delay()
    job.refresh_from_db()
    replica = SpeculativeReplica.objects.get(job=job)
    assert (
        job.state == JobState.UNCONFIRMED and replica.status == "unconfirmed" and replica.evicted_at
    )
    page = fleet.operator.get("/api/cache-map/").json()
    row = next(e for e in page["engines"] if e["id"] == job.target_id)
    assert "x" in row["cells"]  # shown as lost / never confirmed, not as a replica
    r = fleet.operator.get(f"/api/speculative-replicas/{replica.pk}/").json()
    assert r["status"] == "unconfirmed"
    # The engine storing the prefix after the window proves nothing about the copy (its own
    # traffic computes it too): unconfirmed is final.
    target = names[job.target.node_id]
    fleet.report(target, burst.PREFIX, seq=2)
    sweep_jobs.delay()
    job.refresh_from_db()
    assert job.state == JobState.UNCONFIRMED


def test_ttl_eviction_goes_through_the_agent(fleet):
    _, plan = run_cycle(fleet, "auto")
    job = finish(fleet, ReplicationJob.objects.filter(item__plan=plan).first())
    replica = SpeculativeReplica.objects.get(job=job)
    SpeculativeReplica.objects.filter(pk=replica.pk).update(expires_at=replica.placed_at)
    evict_expired.delay()
    evict = ReplicationJob.objects.get(action="evict")
    assert (
        evict.state == JobState.DISPATCHED
        and evict.target_id == replica.engine_id
        and evict.source_id is None
    )
    names = {v: k for k, v in fleet.nodes.items()}
    agent = fleet.agents[names[evict.target.node_id]]
    for msg in ({"type": "job.ack"}, {"type": "job.result", "state": "succeeded", "bytes": 0}):
        assert (
            agent.post(f"/api/agents/jobs/{evict.pk}/events/", msg, format="json").status_code
            == 200
        )
    replica.refresh_from_db()
    assert replica.evicted_at is not None
    assert replica.engine_id not in {
        h.engine for h in get_index().holders(burst.PREFIX) if h.depth == len(burst.PREFIX)
    }


def test_expected_many_matches_the_scalar_sum_for_every_shape():
    """The vectorised expectation equals ``_expected`` bucket by bucket, across groups of
    different start, bucket size and length, negative forecasts, and a forecast in the past."""
    from datetime import UTC, datetime, timedelta

    from controlplane.replication.plans.expected import _expected, expected_many
    from controlplane.replication.plans.inputs import ForecastRow

    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    rows = [
        ForecastRow(1, y, b, "ewma", 0.1, 0.5, now + timedelta(seconds=dt))
        for y, b, dt in [
            ([1.0, 2.0, 3.0], 60, -45),
            ([4.0, -1.0, 6.0], 60, -45),
            ([5.0] * 12, 30, 10),
            ([2.0, 7.0], 60, -3600),
            ([0.0, 0.0], 60, -3600),
            ([], 60, 0),
            ([9.0], 600, 5),
        ]
    ]
    got = expected_many(rows, now, 600.0)
    want = [_expected(f, now, 600.0) for f in rows]
    assert got.tolist() == pytest.approx(want)
    assert want[3] == pytest.approx(70.0) and want[5] == 0.0  # past its horizon: the last level


def test_warmup_is_planned_once_the_prefix_tokens_are_known_and_only_the_engines_events_confirm_it(
    fleet,
):
    policy, plan = run_cycle(fleet, "auto", default_transport="warmup")
    # Gateways sent keys only: a warm-up could not address the prefix, so none is planned (a job
    # sent now would only fail); the key is wanted and the plan says how many items wait.
    assert not ReplicationJob.objects.filter(item__plan=plan).exists()
    assert plan.summary["waiting_for_token_ids"] >= 1
    key = WorkloadKey.objects.get(tenant=burst.TENANT, token_ids_wanted_until__isnull=False)
    assert key.prefix_token_ids == []
    # A gateway sends token ids: they are kept for this key, which a plan wants.
    now = time.time()
    recs = [
        {
            "time": now - 5 + i,
            "tenant": burst.TENANT,
            "model": burst.MODEL,
            "block_size": burst.BLOCK,
            "token_ids": burst.PREFIX_TOKENS + [i] * burst.BLOCK,
        }
        for i in range(3)
    ]
    assert (
        fleet.gateway.post("/api/request-records/", {"records": recs}, format="json").status_code
        == 200
    )
    key.refresh_from_db()
    assert key.prefix_token_ids == burst.PREFIX_TOKENS
    # The next plan places the warm-up, and its job carries the tokens.
    forecast_then_plan(policy)
    plan = ReplicationPlan.objects.filter(policy=policy).order_by("-pk").first()
    assert plan.summary["waiting_for_token_ids"] == 0
    job = ReplicationJob.objects.filter(item__plan=plan, item__workload_key=key).first()
    assert job is not None and job.state == JobState.DISPATCHED and job.attempt == 1, job
    names = {v: k for k, v in fleet.nodes.items()}
    got = fleet.agents[names[job.target.node_id]].get("/api/agents/jobs/?wait=0").json()
    assign = next(m["job"] for m in got if m["job"]["id"] == str(job.pk))
    assert assign["transport"] == "warmup" and assign["tokens"] == burst.PREFIX_TOKENS
    assert assign["block_size"] == burst.BLOCK and assign["hold_until"] > now
    # The warm-up request answered: landed, with what the executor moved (nothing: recomputed).
    agent = fleet.agents[names[job.target.node_id]]
    for msg in (
        {"type": "job.ack"},
        {
            "type": "job.result",
            "state": "succeeded",
            "bytes": 0,
            "executor": "warmup",
            "cached_tokens": 0,
            "prompt_tokens": 2048,
        },
    ):
        assert (
            agent.post(f"/api/agents/jobs/{job.pk}/events/", msg, format="json").status_code == 200
        )
    job.refresh_from_db()
    assert job.state == JobState.LANDED and job.results["target"]["executor"] == "warmup"
    replica = SpeculativeReplica.objects.get(job=job)
    assert replica.bytes_moved == 0 and replica.status == "landed"
    fleet.report(names[job.target.node_id], burst.PREFIX)
    sweep_jobs.delay()
    job.refresh_from_db()
    assert job.state == JobState.CONFIRMED


def test_prefix_token_ids_are_forgotten_past_retention_or_when_turned_off(fleet, settings):
    from controlplane.demand.models import WorkloadKey
    from controlplane.demand.services import forget_prefix_tokens

    fleet.post_burst(time.time())
    key = WorkloadKey.objects.get(tenant=burst.TENANT)
    WorkloadKey.objects.filter(pk=key.pk).update(
        prefix_token_ids=burst.PREFIX_TOKENS, token_ids_wanted_until=None
    )
    assert forget_prefix_tokens() == 1  # no plan uses it
    settings.PREWARM_KEEP_PREFIX_TOKEN_IDS = False
    from datetime import UTC, datetime

    WorkloadKey.objects.filter(pk=key.pk).update(
        prefix_token_ids=burst.PREFIX_TOKENS,
        token_ids_wanted_until=datetime(2100, 1, 1, tzinfo=UTC),
    )
    assert forget_prefix_tokens() == 1
    recs = [
        {
            "time": time.time(),
            "tenant": burst.TENANT,
            "model": burst.MODEL,
            "block_size": burst.BLOCK,
            "token_ids": burst.PREFIX_TOKENS + [1] * burst.BLOCK,
        }
    ]
    assert (
        fleet.gateway.post("/api/request-records/", {"records": recs}, format="json").status_code
        == 200
    )
    key.refresh_from_db()
    assert key.prefix_token_ids == []


def test_hits_come_from_served_request_records_where_gateways_name_the_engine(fleet):
    _, plan = run_cycle(fleet, "auto")
    names = {v: k for k, v in fleet.nodes.items()}
    job = finish(fleet, ReplicationJob.objects.filter(item__plan=plan).first())
    target = Engine.objects.select_related("node").get(pk=job.target_id)
    fleet.report(names[target.node_id], burst.PREFIX)
    sweep_jobs.delay()
    replica = SpeculativeReplica.objects.get(job=job)
    assert replica.status == "confirmed"
    now = time.time()
    prefix_tokens = len(burst.PREFIX) * burst.BLOCK
    base = burst.records(now)[0]
    served = [
        {
            **base,
            "time": now,
            "engine": f"{target.node.name}/{target.engine_id}",
            "cached_tokens": prefix_tokens,
            "ttft_s": 0.05,
        },  # a hit
        {**base, "time": now, "engine": str(target.pk), "cached_tokens": prefix_tokens},
        {**base, "time": now, "engine": str(target.pk), "cached_tokens": 16},  # not covered
        {**base, "time": now, "engine": str(job.source_id), "cached_tokens": prefix_tokens},
    ]
    # An engine Prewarm does not know refuses the batch, and nothing changes.
    r = fleet.gateway.post(
        "/api/request-records/",
        {"records": [*served, {**base, "engine": "nowhere/x"}]},
        format="json",
    )
    assert r.status_code == 400 and "nowhere/x" in r.json()["detail"]
    replica.refresh_from_db()
    assert replica.served_requests == 0
    assert (
        fleet.gateway.post("/api/request-records/", {"records": served}, format="json").status_code
        == 200
    )
    replica.refresh_from_db()
    assert (replica.served_requests, replica.served_hits) == (3, 2)
    score_replicas.delay()
    replica.refresh_from_db()
    assert replica.hits == 2 and replica.hits_measured
    api = fleet.operator.get(f"/api/speculative-replicas/{replica.pk}/").json()
    assert api["hits_basis"] == "measured" and api["bytes_moved"] == job.bytes_done
    board = fleet.operator.get("/api/scoreboard/?since=1999-01-01T00:00:00Z").json()
    assert board["totals"]["hits_basis"] == "measured" and board["totals"]["hits"] == 2
    from django.contrib.auth.models import User
    from django.test import Client

    browser = Client()
    browser.force_login(User.objects.get(username="op"))
    page = browser.get("/scoreboard/")
    assert page.status_code == 200 and b"Hits (measured)" in page.content


def test_job_events_the_node_cannot_apply_are_refused_with_their_field_and_status(fleet):
    """The error's field and status come from where it was raised, not from its wording."""
    _, plan = run_cycle(fleet, "auto")
    job = ReplicationJob.objects.get(item=plan.items.first())
    names = {v: k for k, v in fleet.nodes.items()}
    target = fleet.agents[names[job.target.node_id]]
    bystander = next(
        a
        for n, a in fleet.agents.items()
        if fleet.nodes[n] not in (job.source.node_id, job.target.node_id)
    )
    url = f"/api/agents/jobs/{job.pk}/events/"
    cases = [
        (target, url, {"type": "job.bogus"}, 400, "type"),
        (
            target,
            "/api/agents/jobs/00000000-0000-4000-8000-000000000000/events/",
            {"type": "job.ack"},
            404,
            "job_id",
        ),
        (bystander, url, {"type": "job.ack"}, 404, "job_id"),
    ]
    for agent, path, msg, status, field in cases:
        r = agent.post(path, msg, format="json")
        assert r.status_code == status, (msg, r.content)
        assert r.json()["error"] == "invalid_event" and r.json()["field"] == field, r.content
    assert ReplicationJob.objects.get(pk=job.pk).state == JobState.DISPATCHED  # nothing changed


def test_a_confirmed_job_shows_no_error_of_an_earlier_failed_attempt(fleet, settings):
    """Attempt 1 fails, attempt 2 lands and is confirmed: the job's error (the API, the jobs table
    and its live update) is no longer the first attempt's."""
    settings.PREWARM_JOB_BACKOFF_SECONDS = 0.0
    _, plan = run_cycle(fleet, "auto")
    job = ReplicationJob.objects.filter(item__plan=plan).first()
    names = {v: k for k, v in fleet.nodes.items()}
    source = fleet.agents[names[job.source.node_id]]
    for msg in (
        {"type": "job.ack"},
        {"type": "job.result", "state": "failed", "error": "disk full"},
    ):
        assert (
            source.post(f"/api/agents/jobs/{job.pk}/events/", msg, format="json").status_code == 200
        )
    job.refresh_from_db()
    assert job.attempt == 2 and "disk full" in job.error  # the retry says why it was needed
    job = finish(fleet, job)
    fleet.report(names[job.target.node_id], burst.PREFIX)
    sweep_jobs.delay()
    job.refresh_from_db()
    assert job.state == JobState.CONFIRMED and job.attempt == 2
    assert job.error == "" and _job_via_api(fleet, job)["error"] == ""
    from django.contrib.auth.models import User
    from django.test import Client

    browser = Client()
    browser.force_login(User.objects.get(username="op"))
    page = browser.get("/jobs/").content.decode()
    row = page[page.index(f'data-job="{job.pk}"') :]
    error_cell = re.search(r'data-field="error"[^>]*>([^<]*)</td>', row).group(1)
    assert error_cell == ""
    # The attempt's history still tells the story.
    assert any("disk full" in t.detail for t in job.transitions.all())
