"""A copy is credited only for what it caused: confirmation by blocks the target lacked at
dispatch and stored after the job started, partial and redundant copies, one replica per
(prefix, engine), counterfactual credit and the randomized holdout. All through the API."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.replication.choices import ItemDecision, JobState
from controlplane.replication.models import HoldoutDraw, ReplicationJob, SpeculativeReplica
from controlplane.replication.plans.costs import cost_model_for, prefill_s
from controlplane.replication.tasks import evict_expired, score_replicas, sweep_jobs
from harness import burst
from tests.workflow.evidence import TOKENS, Evidence, confirmed_copy, prefix, since


@pytest.fixture
def ev(fleet):
    e = Evidence(fleet)
    e.report("node-a", [k for i in range(3) for k in prefix(i)])
    return e


def _one_job(ev, policy, key, target="node-b"):
    plan = ev.plan(policy, [(key, target)])
    assert ev.approve(plan)["refused"] == {}
    return ReplicationJob.objects.get(item__plan=plan)


def test_copy_confirmed_when_the_report_with_new_blocks_is_applied(ev, fleet):
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = _one_job(ev, policy, key)
    assert job.state == JobState.DISPATCHED and job.held_at_dispatch == []
    job = ev.land(job)
    assert job.state == JobState.LANDED
    ev.report("node-b", prefix(0))  # no sweep: the report's application confirms it
    job.refresh_from_db()
    replica = SpeculativeReplica.objects.get(job=job)
    assert job.state == JobState.CONFIRMED and replica.confirmed_by == "kv-events"
    assert replica.tokens == TOKENS and replica.new_tokens == TOKENS


def test_a_report_on_its_way_at_dispatch_is_no_evidence_of_the_copy(ev, fleet, settings):
    """The engine computed the prefix itself just before dispatch; its agent's report saying
    so is applied after dispatch. The target's ack names that report (it spooled it before
    taking the job), so the copy is not confirmed by it; a later report would."""
    settings.PREWARM_REPLICA_CONFIRM_SECONDS = 0.0
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = _one_job(ev, policy, key)
    assert job.state == JobState.DISPATCHED and job.held_at_dispatch == []
    ev.report("node-b", prefix(0))  # spooled before the ack, applied after dispatch
    job = ev.land(job, cut=True)
    assert job.target_report_seq == ev.seq["node-b"] and job.stored_since == []
    sweep_jobs.delay()
    job.refresh_from_db()
    assert job.state == JobState.REDUNDANT  # held, but nothing shows the copy put it there
    assert not SpeculativeReplica.objects.filter(job=job, confirmed_at__isnull=False).exists()


def test_a_report_after_the_targets_ack_confirms_the_copy(ev, fleet):
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = ev.land(_one_job(ev, policy, key), cut=True)
    ev.report("node-b", prefix(0))  # after the cut: the copy's blocks
    job.refresh_from_db()
    assert job.state == JobState.CONFIRMED
    assert SpeculativeReplica.objects.get(job=job).new_tokens == TOKENS


def test_an_ack_with_a_bad_report_seq_is_refused_and_changes_nothing(ev, fleet):
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = _one_job(ev, policy, key)
    target = fleet.agents["node-b"]
    for bad in (-1, "7", 1.5, True):
        r = target.post(
            f"/api/agents/jobs/{job.pk}/events/",
            {"type": "job.ack", "job_id": str(job.pk), "report_seq": bad},
            format="json",
        )
        assert r.status_code == 400 and "report_seq" in r.content.decode(), (bad, r.content)
    job.refresh_from_db()
    assert job.state == JobState.DISPATCHED and job.acks == {}
    assert job.target_report_seq is None


def test_target_that_held_the_prefix_before_dispatch_ends_redundant(ev, fleet):
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    ev.report("node-b", prefix(0))  # the engine computed the prefix itself, before the plan
    job = _one_job(ev, policy, key)
    assert job.state == JobState.REDUNDANT and job.attempt == 0  # never sent to an agent
    assert not SpeculativeReplica.objects.filter(job=job).exists()  # no replica, no credit
    # Its agent's later reports list the same blocks again, and the engine serves the prefix
    # from its own cache: still nothing the copy did, nothing credited.
    ev.report("node-b", prefix(0))
    ev.served(key, "node-b", 5, cached=TOKENS, ttft_s=0.1)
    score_replicas.delay()
    job.refresh_from_db()
    assert job.state == JobState.REDUNDANT and not SpeculativeReplica.objects.exists()
    board = fleet.operator.get(f"/api/scoreboard/?since={since()}").json()
    assert board["totals"]["replicas"] == 0
    assert board["totals"]["hits"] == 0 and board["totals"]["ttft_saved_s"] == 0


def test_blocks_held_before_dispatch_are_not_the_copys(ev, fleet):
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    half = prefix(0)[: len(prefix(0)) // 2]
    ev.report("node-b", half)
    job = ev.land(_one_job(ev, policy, key))
    assert len(job.held_at_dispatch) == len(half)
    ev.report("node-b", prefix(0))
    job.refresh_from_db()
    replica = SpeculativeReplica.objects.get(job=job)
    assert job.state == JobState.CONFIRMED
    assert replica.tokens == TOKENS and replica.new_tokens == TOKENS // 2


def test_unconfirmed_stays_unconfirmed_when_the_engine_computes_the_prefix_later(
    ev, fleet, settings
):
    settings.PREWARM_REPLICA_CONFIRM_SECONDS = 0.0
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = ev.land(_one_job(ev, policy, key))
    sweep_jobs.delay()
    job.refresh_from_db()
    assert job.state == JobState.UNCONFIRMED
    ev.report("node-b", prefix(0))  # its own traffic, after the window: proves nothing
    sweep_jobs.delay()
    job.refresh_from_db()
    assert job.state == JobState.UNCONFIRMED
    assert SpeculativeReplica.objects.get(job=job).confirmed_at is None


def test_partial_copy_is_scored_on_the_tokens_it_covers(ev, fleet, settings):
    settings.PREWARM_REPLICA_CONFIRM_SECONDS = 0.0
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = ev.land(_one_job(ev, policy, key))
    ev.report("node-b", prefix(0)[:16])  # 16 of 64 blocks arrived
    job.refresh_from_db()
    assert job.state == JobState.LANDED  # not the whole prefix: wait for the window
    sweep_jobs.delay()
    job.refresh_from_db()
    replica = SpeculativeReplica.objects.get(job=job)
    assert job.state == JobState.PARTIAL and replica.status == "partial"
    assert replica.tokens == 16 * burst.BLOCK == replica.new_tokens
    ev.served(key, "node-b", 5, cached=16 * burst.BLOCK)
    score_replicas.delay()
    replica.refresh_from_db()
    cm = cost_model_for(burst.MODEL)
    assert replica.hits == 5 and replica.saving_basis == "cost-model"
    assert replica.ttft_saved_s == pytest.approx(prefill_s(cm, 16 * burst.BLOCK))
    assert replica.ttft_saved_s < prefill_s(cm, TOKENS)


def test_one_replica_per_prefix_and_engine(ev, fleet):
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = ev.land(_one_job(ev, policy, key))  # landed, not confirmed yet
    again = ev.plan(policy, [(key, "node-b"), (key, "node-c")])
    refused = ev.approve(again)["refused"]
    assert list(refused.values()) == [
        f"one replica per prefix and engine: job {str(job.pk)[:8]} is landed"
    ]
    ev.report("node-b", prefix(0))
    ev.report("node-c", prefix(0))
    ev.served(key, "node-b", 4, cached=TOKENS)
    replicas = SpeculativeReplica.objects.filter(engine=ev.engine["node-b"])
    assert replicas.count() == 1 and replicas.get().served_requests == 4


def test_a_used_replica_is_credited_at_most_one_prefill_however_slow_the_misses(ev, fleet):
    """Misses elsewhere took 1.1 s and hits 0.1 s: 1.0 s apart, queueing included. One prefill of
    1,024 tokens of llama3-70b on an H100 is ~74 ms: the credit is capped there, not 1.0 s, and
    not 20 x anything."""
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = ev.land(_one_job(ev, policy, key))
    ev.report("node-b", prefix(0))
    ev.served(key, "node-b", 20, cached=TOKENS, ttft_s=0.1)  # 20 hits
    ev.served(key, "node-c", 4, cached=0, ttft_s=1.1)  # the key's misses elsewhere
    score_replicas.delay()
    replica = SpeculativeReplica.objects.get(job=job)
    assert replica.hits == 20 and replica.saving_basis == "measured-ttft"
    assert 0.03 < replica.ttft_saved_s < 0.15
    board = fleet.operator.get(f"/api/scoreboard/?since={since()}").json()
    assert board["totals"]["ttft_saved_s"] == pytest.approx(replica.ttft_saved_s)
    assert board["totals"]["saving_basis"] == "measured TTFT"


def test_a_measured_gap_below_one_prefill_is_credited_as_measured(ev, fleet):
    """Misses 0.12 s, hits 0.1 s: the measured 20 ms is the credit, below the prefill cap."""
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = ev.land(_one_job(ev, policy, key))
    ev.report("node-b", prefix(0))
    ev.served(key, "node-b", 5, cached=TOKENS, ttft_s=0.1)
    ev.served(key, "node-c", 5, cached=0, ttft_s=0.12)
    score_replicas.delay()
    assert SpeculativeReplica.objects.get(job=job).ttft_saved_s == pytest.approx(0.02)


def _two_arms(ev, fleet, monkeypatch, settings):
    """Key 0 drawn treated, key 1 held out (a 50% share: one permuted block of two)."""
    from controlplane.replication.plans import holdout

    settings.PREWARM_JOB_MAX_ATTEMPTS = 1  # a failed copy is final
    policy = fleet.policy("manual", holdout_fraction=0.5)
    coins = iter([0.9, 0.1])
    monkeypatch.setattr(holdout, "_uniform", lambda: next(coins))
    k0, k1 = ev.key(0), ev.key(1)
    plan = ev.plan(policy, [(k0, "node-b"), (k1, "node-b")])
    assert ev.approve(plan)["refused"] == {}
    items = {i.workload_key_id: i for i in plan.items.all()}
    assert items[k0.pk].decision == ItemDecision.APPROVED
    assert items[k1.pk].decision == ItemDecision.HELD_OUT
    return k0, k1, items[k0.pk], items[k1.pk]


def test_a_failed_copy_stays_in_the_treated_arm_with_its_cost(ev, fleet, monkeypatch, settings):
    """Intention to treat: the treated prefix's copy fails, so nothing is placed, yet its
    assignment is in the treated arm, measured on its requests, and what the copy would take
    counts as the arm's cost; per protocol (shown beside) it drops out."""
    k0, k1, treated, _ = _two_arms(ev, fleet, monkeypatch, settings)
    job = ReplicationJob.objects.get(item=treated)
    names = {v: k for k, v in fleet.nodes.items()}
    agent = fleet.agents[names[job.source.node_id]]
    for msg in ({"type": "job.ack"}, {"type": "job.result", "state": "failed", "error": "gone"}):
        assert (
            agent.post(f"/api/agents/jobs/{job.pk}/events/", msg, format="json").status_code == 200
        )
    job.refresh_from_db()
    assert job.state == JobState.FAILED and not SpeculativeReplica.objects.filter(job=job).exists()
    ev.served(k0, "node-a", 3, cached=TOKENS, ttft_s=0.9)
    ev.served(k1, "node-a", 2, cached=TOKENS, ttft_s=0.7)
    score_replicas.delay()
    ho = fleet.operator.get(f"/api/scoreboard/?since={since()}").json()["holdout"]
    assert ho["analysis"] == "intention to treat"
    assert (ho["treated"]["assignments"], ho["treated"]["requests"]) == (1, 3)
    assert ho["treated"]["ttft_mean_s"] == pytest.approx(0.9)
    assert ho["treated_cost_s"] == pytest.approx(treated.cost_s) and treated.cost_s > 0
    assert (ho["held_out"]["assignments"], ho["held_out"]["requests"]) == (1, 2)
    assert ho["per_protocol"]["treated_assignments"] == 0


def test_both_arms_are_measured_over_the_same_window(ev, fleet, monkeypatch, settings):
    """Both assignments' windows open at the decision plus the item's modelled placement time
    and last the replica TTL, whatever the copy did: the treated copy lands and is then lost,
    and the treated prefix's requests after the loss still count for its arm."""
    k0, k1, treated, held = _two_arms(ev, fleet, monkeypatch, settings)
    d0, d1 = treated.holdout_draw, held.holdout_draw
    policy = treated.plan.policy
    for item, d in ((treated, d0), (held, d1)):
        assert (d.window_start - item.decided_at).total_seconds() == pytest.approx(item.cost_s)
        assert (d.window_end - d.window_start).total_seconds() == policy.replica_ttl_s
    job = ev.land(ReplicationJob.objects.get(item=treated))
    ev.report("node-b", prefix(0))
    # The copy's hold ends with its assignment's window, not a TTL after it landed.
    assert SpeculativeReplica.objects.get(job=job).expires_at <= d0.window_end
    ev.held["node-b"] = []
    ev.report("node-b")  # the copy leaves its engine
    sweep_jobs.delay()
    assert SpeculativeReplica.objects.get(job=job).lost_at is not None
    ev.served(k0, "node-a", 4, cached=TOKENS, ttft_s=0.5)
    ev.served(k1, "node-a", 4, cached=TOKENS, ttft_s=0.5)
    d0.refresh_from_db()
    d1.refresh_from_db()
    assert (d0.requests, d1.requests) == (4, 4)


def test_behind_a_router_the_taps_records_measure_both_arms(ev, fleet, monkeypatch, settings):
    """Behind vllm-router the records come from each engine's own tap (its agent), and the router
    sends a prefix to the engine that holds it, not to the assignment's target: every engine's
    agent-reported requests of the prefix still count for its assignment, on both arms. Counting
    only the target's own agent's records left the real-engine demo's holdout empty."""
    k0, k1, treated, held = _two_arms(ev, fleet, monkeypatch, settings)
    assert treated.target.node_id == held.target.node_id == fleet.nodes["node-b"]
    ev.served(k0, "node-a", 3, cached=TOKENS, ttft_s=0.2, by_agent=True)
    ev.served(k1, "node-c", 2, cached=0, ttft_s=1.1, by_agent=True)
    d0, d1 = treated.holdout_draw, held.holdout_draw
    d0.refresh_from_db()
    d1.refresh_from_db()
    assert (d0.requests, d0.ttft_n, d1.requests, d1.ttft_n) == (3, 3, 2, 2)
    ho = fleet.operator.get(f"/api/scoreboard/?since={since()}").json()["holdout"]
    assert ho["treated"]["assignments_with_ttft"] == ho["held_out"]["assignments_with_ttft"] == 1
    assert ho["held_out"]["ttft_mean_s"] == pytest.approx(1.1)


def test_holdout_withholds_an_approved_item_and_records_what_it_would_have_done(ev, fleet):
    policy = fleet.policy("manual", holdout_fraction=1.0)
    key = ev.key(0)
    plan = ev.plan(policy, [(key, "node-c")])
    assert ev.approve(plan)["refused"] == {}
    item = plan.items.get()
    assert item.decision == ItemDecision.HELD_OUT and not ReplicationJob.objects.exists()
    held = SpeculativeReplica.objects.get(item=item)
    assert held.held_out and held.status == "held_out" and held.engine == ev.engine["node-c"]
    assert held.bytes == item.bytes and held.tokens == TOKENS
    # Its hold starts when the copy would have landed: approval plus the item's placement cost.
    assert (held.placed_at - item.decided_at).total_seconds() == pytest.approx(item.cost_s)
    # Cache-aware routing sends the prefix to its holder, never to the held-out pair's engine:
    # the holdout measures the prefix's requests, whatever engine served them.
    ev.served(key, "node-a", 3, cached=TOKENS, ttft_s=1.5)
    score_replicas.delay()
    held.refresh_from_db()
    assert held.served_requests == 0 and held.hits == 0 and held.ttft_saved_s == 0
    assert (held.key_requests, held.key_hits, held.key_ttft_n) == (3, 3, 3)
    board = fleet.operator.get(f"/api/scoreboard/?since={since()}").json()
    assert board["totals"]["replicas"] == 0  # never placed: not a live replica
    ho = board["holdout"]
    arm = ho["held_out"]
    assert ho["unit"] == "assignment" and (arm["assignments"], arm["prefixes"]) == (1, 1)
    assert arm["requests"] == 3
    assert arm["ttft_mean_s"] == pytest.approx(1.5) and arm["hit_rate"] == 1.0
    assert ho["ttft_samples"]["held_out"] == [1.5, 1.5, 1.5]
    # Its hold ends: nothing was placed, so nothing is evicted from the engine.
    SpeculativeReplica.objects.filter(pk=held.pk).update(expires_at=held.placed_at)
    evict_expired.delay()
    held.refresh_from_db()
    assert held.evicted_at == held.placed_at and not ReplicationJob.objects.exists()


def test_holdout_coin_is_drawn_per_prefix_and_kept_while_it_has_a_live_record(
    ev, fleet, monkeypatch
):
    """A prefix is never on both arms at once: once held out, its later items are held out
    whatever the coin says; once treated, its later items are treated."""
    from controlplane.replication.plans import holdout

    policy = fleet.policy("manual", holdout_fraction=0.5)
    coins = iter([0.1, 0.9])  # key 0 held out, key 1 treated
    monkeypatch.setattr(holdout, "_uniform", lambda: next(coins))
    k0, k1 = ev.key(0), ev.key(1)
    first = ev.plan(policy, [(k0, "node-b"), (k1, "node-b")])
    assert ev.approve(first)["refused"] == {}
    assert {i.workload_key_id: i.decision for i in first.items.all()} == {
        k0.pk: ItemDecision.HELD_OUT,
        k1.pk: ItemDecision.APPROVED,
    }
    flipped = iter([0.9, 0.1])  # would swap both prefixes' arms, were they drawn again
    monkeypatch.setattr(holdout, "_uniform", lambda: next(flipped))
    second = ev.plan(policy, [(k0, "node-c"), (k1, "node-c")])
    assert ev.approve(second)["refused"] == {}
    assert {i.workload_key_id: i.decision for i in second.items.all()} == {
        k0.pk: ItemDecision.HELD_OUT,
        k1.pk: ItemDecision.APPROVED,
    }
    # Each of a prefix's requests counts for one of its records, never for both arms.
    ev.served(k0, "node-a", 2, cached=TOKENS, ttft_s=1.0)
    held = SpeculativeReplica.objects.filter(workload_key=k0, held_out=True)
    assert sorted(held.values_list("key_requests", flat=True)) == [0, 2]


def test_holdout_arms_are_drawn_in_permuted_blocks(ev, fleet, monkeypatch):
    """At a 50% share every block of two new prefixes holds out exactly one, however the draws
    fall (a coin per prefix would hold out all eight below), and each draw is recorded."""
    from controlplane.replication.plans import holdout

    assert holdout.block_shape(0.5) == (2, 1) and holdout.block_shape(0.15) == (20, 3)
    assert holdout.block_shape(0.1) == (10, 1) and holdout.block_shape(0.0) == (1, 0)
    policy = fleet.policy("manual", holdout_fraction=0.5)
    monkeypatch.setattr(holdout, "_uniform", lambda: 0.0)  # every draw as low as it gets
    keys = [ev.key(i) for i in range(8)]
    plan = ev.plan(policy, [(k, "node-b") for k in keys])
    assert ev.approve(plan)["refused"] == {}
    held = {i.workload_key_id: i.decision == ItemDecision.HELD_OUT for i in plan.items.all()}
    draws = list(HoldoutDraw.objects.filter(policy=policy).order_by("pk"))
    assert [d.workload_key_id for d in draws] == [k.pk for k in keys]
    assert [d.held_out for d in draws] == [held[k.pk] for k in keys]
    assert [d.held_out for d in draws] == [True, False] * 4
    assert [d.probability for d in draws] == [0.5, 0.0] * 4
    assert [d.block for d in draws] == [0, 0, 1, 1, 2, 2, 3, 3]
    from controlplane.replication.scoreboard import scoreboard

    assert scoreboard()["holdout"]["randomization"] == [
        {"policy": policy.name, "block_size": 2, "held_per_block": 1, "draws": 8, "held_out": 4}
    ]


@pytest.mark.holdout_default
def test_a_policy_without_its_own_share_holds_out_the_deployment_default(ev, fleet, settings):
    """20 prefixes approved under a policy with no holdout_fraction: the deployment default,
    15%, holds out exactly 3 (one permuted block of 20); with the test default of 0 it would
    hold out none."""
    assert settings.PREWARM_HOLDOUT_FRACTION == pytest.approx(0.15)
    policy = fleet.policy("manual")
    assert policy.holdout_fraction is None
    plan = ev.plan(policy, [(ev.key(i), "node-b") for i in range(20)])
    assert ev.approve(plan)["refused"] == {}
    decisions = list(plan.items.values_list("decision", flat=True))
    assert decisions.count(ItemDecision.HELD_OUT) == 3
    assert decisions.count(ItemDecision.APPROVED) == 17


@pytest.mark.parametrize("budget", ["transfer", "vram"])
def test_items_approved_together_are_counted_once_against_the_budgets(ev, fleet, budget):
    """A budget that fits exactly two items approves two in one decision (their jobs count once,
    not once as jobs and again as this decision's extra) and refuses the third."""
    policy = fleet.policy("manual", holdout_fraction=0.0)
    keys = [ev.key(i) for i in range(3)]
    plan = ev.plan(policy, [(k, "node-b") for k in keys])
    two = sum(i.bytes for i in plan.items.filter(workload_key__in=keys[:2]))
    if budget == "transfer":
        policy.max_bytes_per_interval = two
    else:
        policy.max_spec_vram_fraction = two / ev.engine["node-b"].kv_capacity_bytes
    policy.save()
    refused = ev.approve(plan)["refused"]
    decisions = {i.workload_key_id: i.decision for i in plan.items.all()}
    assert [decisions[k.pk] for k in keys] == [ItemDecision.APPROVED] * 2 + [ItemDecision.PENDING]
    assert list(refused) == [str(plan.items.get(workload_key=keys[2]).pk)]
    assert ReplicationJob.objects.count() == 2


def test_a_prefix_drawn_again_after_its_holds_ended_is_a_new_assignment(ev, fleet):
    """The holdout's unit is the draw: a prefix held out, its hold and window over, then
    approved again is drawn again, and the comparison counts two assignments of one prefix, each
    measured on the requests of its own window."""
    policy, key = fleet.policy("manual", holdout_fraction=1.0), ev.key(0)
    first = ev.plan(policy, [(key, "node-c")])
    assert ev.approve(first)["refused"] == {}
    ev.served(key, "node-a", 2, cached=TOKENS, ttft_s=1.0)
    ended = timezone.now()
    SpeculativeReplica.objects.filter(item__plan=first).update(expires_at=ended)
    HoldoutDraw.objects.filter(item__plan=first).update(window_end=ended)
    second = ev.plan(policy, [(key, "node-c")])
    assert ev.approve(second)["refused"] == {}
    ev.served(key, "node-a", 3, cached=TOKENS, ttft_s=2.0)
    draws = [i.holdout_draw for i in (first.items.get(), second.items.get())]
    assert draws[0] and draws[1] and draws[0].pk != draws[1].pk
    score_replicas.delay()
    ho = fleet.operator.get(f"/api/scoreboard/?since={since()}").json()["holdout"]
    arm = ho["held_out"]
    assert (arm["assignments"], arm["prefixes"], arm["requests"]) == (2, 1, 5)
    assert arm["assignments_with_ttft"] == 2


def test_a_confirmed_copy_whose_blocks_leave_the_engine_is_lost(ev, fleet):
    policy, key = fleet.policy("manual", holdout_fraction=0.0), ev.key(0)
    job = confirmed_copy(ev, policy, key, "node-b")
    ev.held["node-b"] = []
    ev.report("node-b")  # the engine evicted the prefix before the hold ended
    sweep_jobs.delay()
    job.refresh_from_db()
    replica = SpeculativeReplica.objects.get(job=job)
    assert job.state == JobState.LOST and replica.status == "lost" and replica.lost_at
