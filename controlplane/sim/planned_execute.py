"""How a planned policy (``planned.PlannedPolicy``) executes the shared policy's items in the
simulation: speculative copies with a TTL and promotions, each watched for the value model
(``sim.valued``) and the harm guard (``sim.guarded``)."""

from __future__ import annotations

from wire.protocol import ENGINE_SERVING, ENGINE_WARMING, TIER_CPU, TIER_DISK


def execute(policy, sim, it, t: float) -> None:  # policy: a planned.PlannedPolicy
    """Execute one of the shared policy's items in the simulation: a copy (or a promotion from a
    lower tier) started now or at its ``start_in_s``, watched by the value model's ledger and,
    where the policy has one, by the harm guard."""
    pid = int(it.prefix_id)
    dst = sim.engines[int(it.target[1:])]
    ttl = policy.budgets.ttl_s
    states, _demand, queues = policy._round
    policy.plan_items += 1
    if len(policy.reasons) < 50:
        policy.reasons.append(f"t={t:.0f}s {it.prefix_id}->{it.target}: {it.reason}")

    joining = states.get(it.target)
    lead = 0.0
    if joining is not None and joining.lifecycle == ENGINE_WARMING:
        lead = joining.starts_serving_in_s

    def watch(land: float | None) -> None:  # its window: the horizon its value counts
        policy.values.record(
            terms=it.terms,
            prefix=pid,
            engine=dst.eid,
            lands_at=land,
            ends_at=t + lead + policy.budgets.horizon_s,
            one_prefill_s=policy._one_prefill.get(pid, 0.0),
        )

    def go(when: float) -> None:
        if it.tier in (TIER_CPU, TIER_DISK):
            watch(sim.promote(dst, it.keys, when, ttl))
            return
        src = sim.engines[int(it.source[1:])]
        # A copy that would land after the horizon (the link is busy with earlier copies)
        # serves a forecast that is stale by then: skip it rather than queue on the link.
        eta = sim.copy_eta(src, dst, it.nbytes, when)
        if eta - when > policy.budgets.horizon_s:
            policy.skipped += 1
            return
        land = sim.start_copy(
            pid,
            it.keys,
            src,
            dst,
            when,
            speculative=True,
            ttl_s=ttl,
            value_of=policy._vf,
            budget=max(0.0, it.expected_ttft_saved_s - it.cost_s),
            keep_s=policy.budgets.horizon_s,
        )
        watch(land)
        if policy.guard is not None:
            tgt = states.get(it.target)
            policy.guard.record(
                target=it.target,
                queue_before_s=None
                if tgt is None or tgt.lifecycle != ENGINE_SERVING
                else tgt.queue_s,
                group=sim.workload.prefix_wkey[pid],
                prefix=pid,
                queues_at_plan=queues,
                planned_at=t,
                lands_at=land,
            )

    if it.start_in_s > 0:
        sim.events.at(t + it.start_in_s, go)
    else:
        go(t)
