"""Landed copies count only for what they put on the target engine, shown by the engine side,
after the job started: confirmation, partial copies, redundant copies, loss, no phantoms.

An executor's success makes a replicate job ``landed`` and records its replica; nothing writes
the copy into the residency index (only agents' reports of the engines' own KV events do), so
the cache map and the residency lookup gateways route by never show a copy the engine did not
confirm. What counts as evidence:

- **At dispatch** the blocks of the prefix the target already holds (residency index) are
  recorded (``held_at_dispatch``). If it holds all of them, the copy is pointless: the job ends
  ``redundant`` without being sent (no replica, no credit).
- **KV events** (``warmup``, and ``tcp``/``nccl`` in the virtual cluster, whose engines publish
  the blocks they gain): each agent report applied after dispatch that stores blocks of the
  prefix on the target adds them to the job's ``stored_since`` (``fleet.signals
  .residency_reported``, sent when the report is applied: confirmation is evaluated then, not
  by a poll). The target's agent spools a report of every event it has before it acknowledges
  the job and names it in ``job.ack`` (``report_seq``): that report and earlier ones, even when
  applied after dispatch (on their way meanwhile), show what the engine held before the job
  and count for nothing (``on_target_cut``). The copy is ``confirmed`` once the index holds the whole chain on the target and
  every block it lacked at dispatch was stored since. A block the engine held before, or that
  appeared with no report after dispatch, proves nothing about the copy.
- **LMCache** (``lmcache``, ``lmcache-mp``): the executor reads the controller (pin) or the
  coordinator's directory on the target before and after the copy and reports both
  (``confirmation: {"by", "tokens", "before"}``). The control plane checks them against the
  tokens the plan asked for (the prefix's chain x block size), never the executor's own
  expectation: ``tokens`` >= asked confirms; ``before`` < ``tokens`` < asked is ``partial``;
  ``before`` >= asked is ``redundant``. Each lease renewal reports again as ``job.confirm``;
  fewer tokens than the replica covers is a loss.

A copy that shows part of the prefix new since dispatch is ``partial`` and its replica covers
those tokens (``tokens``; ``new_tokens`` of them new), scored on them. A landed copy with no
evidence within ``PREWARM_REPLICA_CONFIRM_SECONDS`` is judged then: ``partial`` on what evidence
there is, ``redundant`` where the target holds the prefix without evidence the copy put it there,
else ``unconfirmed`` (final: the engine's own traffic storing the prefix later proves nothing);
a confirmed copy whose blocks leave the target before its hold ends is ``lost``. ``sweep`` runs
the timeouts and the loss checks with the job sweep.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.fleet.configured_index import get_index
from controlplane.realtime.publish import publish_event
from wire import blockhash, protocol

from ..choices import Confirmation, JobAction, JobState, Transport
from ..models import ReplicationJob, SpeculativeReplica
from .messages import EventError, job_update
from .states import IllegalTransition, transition

log = logging.getLogger(__name__)
HOLDERS_LIMIT = 256
ENGINE_SIDE = {Confirmation.LMCACHE_PIN, Confirmation.LMCACHE_DIRECTORY}
# Evidence still counts while the copy may be on its way or awaiting the engine.
AWAITING = (JobState.DISPATCHED, JobState.RUNNING, JobState.LANDED)


def _chain(job_or_replica) -> list[int]:
    return [blockhash.from_hex(k) for k in job_or_replica.prefix_keys]


def _hex(keys) -> list[str]:
    return [blockhash.to_hex(k) for k in keys]


def replica_of(job: ReplicationJob) -> SpeculativeReplica | None:
    return SpeculativeReplica.objects.filter(job=job).first()


def _on_target(job: ReplicationJob) -> dict[int, str]:
    """The prefix's blocks the residency index shows on the job's target: key -> tier."""
    index = get_index()
    out = {}
    for key in _chain(job):
        tier = index.engines_of(key).get(job.target_id)
        if tier is not None:
            out[key] = tier
    return out


def _depth(chain: list[int], held: dict[int, str]) -> int:
    """How many blocks of ``chain``, from its root, ``held`` has without a gap."""
    for i, key in enumerate(chain):
        if key not in held:
            return i
    return len(chain)


def held_at_dispatch(job: ReplicationJob) -> list[str]:
    """The prefix's blocks (hex, root first) the target holds as the job is dispatched."""
    if job.action != JobAction.REPLICATE or job.target_id is None:
        return []
    held = _on_target(job)
    return _hex(k for k in _chain(job) if k in held)


def _create_replica(job: ReplicationJob) -> SpeculativeReplica:
    item = job.item
    now = timezone.now()
    ttl = item.plan.policy.replica_ttl_s if item else 900
    expires = now + timedelta(seconds=ttl)
    draw = item.holdout_draw if item and item.holdout_draw_id else None
    if draw is not None and draw.window_end is not None:
        # The holdout's assignment ends with its window: a copy approved late in it ends there
        # too, so the prefix's next approval draws its arm afresh (one unit per window).
        expires = min(expires, max(now, draw.window_end))
    replica, _ = SpeculativeReplica.objects.get_or_create(
        job=job,
        defaults=dict(
            item=item,
            engine_id=job.target_id,
            workload_key=item.workload_key if item else None,
            prefix_keys=job.prefix_keys,
            tier=Transport.LANDS_IN.get(job.transport, job.tier),
            bytes=job.bytes,
            bytes_moved=job.bytes_done,
            shadow=False,
            forecaster=(
                item.plan.summary.get("forecasters", {}).get(str(item.workload_key_id), "")
                if item
                else ""
            ),
            placed_at=now,
            expires_at=expires,
        ),
    )
    return replica


def _publish(job: ReplicationJob, why: str) -> None:
    publish_event(job_update(job, why))


def confirm(
    job: ReplicationJob,
    by: str,
    detail: str,
    tokens: int,
    new_tokens: int,
    tier: str | None = None,
) -> ReplicationJob:
    """Landed -> confirmed (the whole prefix) or partial (``tokens`` of it); the replica covers
    ``tokens`` from the chain's start, ``new_tokens`` of them placed by this copy."""
    now = timezone.now()
    full = len(job.prefix_keys) * (job.target.block_size if job.target else 0)
    to = JobState.CONFIRMED if tokens >= full else JobState.PARTIAL
    word = to if to == JobState.CONFIRMED else f"{to} ({tokens} of {full} tokens)"
    job = transition(job, to, f"{word} by {by}: {detail}")
    replica = replica_of(job) or _create_replica(job)
    replica.confirmed_at, replica.confirmed_by = now, by
    replica.tokens, replica.new_tokens = tokens, new_tokens
    fields = ["confirmed_at", "confirmed_by", "tokens", "new_tokens"]
    if tier:
        replica.tier = tier
        fields.append("tier")
    replica.save(update_fields=fields)
    _publish(job, detail)
    return job


def redundant(job: ReplicationJob, why: str) -> ReplicationJob:
    """The target held what the copy would have placed: no replica, no credit."""
    job = transition(job, JobState.REDUNDANT, why)
    SpeculativeReplica.objects.filter(job=job).delete()
    _publish(job, why)
    return job


def evaluate(job: ReplicationJob, final: bool = False) -> ReplicationJob:
    """Judge a landed KV-events copy on its evidence: confirmed, or (``final``: its window is
    over) partial, redundant or unconfirmed; otherwise it keeps waiting."""
    chain = _chain(job)
    bs = job.target.block_size if job.target else 0
    before = {blockhash.from_hex(k) for k in job.held_at_dispatch}
    since = {blockhash.from_hex(k) for k in job.stored_since}
    needed = [k for k in chain if k not in before]
    if not needed:
        return redundant(job, "the target held the whole prefix before the copy")
    held = _on_target(job)
    depth = _depth(chain, held)
    if depth == len(chain) and all(k in since for k in needed):
        tiers = {held[k] for k in chain}
        tier = max(tiers, key=lambda t: protocol.TIER_RANK[t])
        return confirm(
            job,
            Confirmation.KV_EVENTS,
            f"the target's KV events stored the {len(needed)} blocks it lacked at dispatch",
            len(chain) * bs,
            len(needed) * bs,
            tier=tier,
        )
    if not final:
        return job
    # The part with evidence: from the root up to the first block neither held before nor
    # stored since (and still held).
    proven = 0
    for key in chain[:depth]:
        if key not in before and key not in since:
            break
        proven += 1
    new = [k for k in chain[:proven] if k not in before]
    if new:
        tier = max((held[k] for k in chain[:proven]), key=lambda t: protocol.TIER_RANK[t])
        return confirm(
            job,
            Confirmation.KV_EVENTS,
            f"the target's KV events stored {len(new)} of the {len(needed)} blocks it lacked",
            proven * bs,
            len(new) * bs,
            tier=tier,
        )
    if depth or before:
        return redundant(
            job,
            "the target holds the prefix's blocks, but no report after dispatch stored the "
            "ones it lacked: the copy placed nothing",
        )
    return unconfirmed(job)


def _reading(job: ReplicationJob, msg: dict | None) -> tuple[str, int, int, str] | None:
    """An engine-side reading (LMCache pin or directory): (by, tokens resident, before, where);
    None when ``msg`` is none; EventError when it is malformed."""
    if not isinstance(msg, dict):
        return None
    by = str(msg.get("by") or "")
    if by not in ENGINE_SIDE:
        raise EventError(f"confirmation by must be one of {sorted(ENGINE_SIDE)}", field="by")
    try:
        got, before = int(msg.get("tokens") or 0), int(msg.get("before") or 0)
    except (TypeError, ValueError):
        raise EventError("confirmation tokens are not integers", field="tokens") from None
    return by, max(0, got), max(0, before), str(msg.get("instance_id") or "the target")


def _judge_reading(job: ReplicationJob, by: str, got: int, before: int, where: str):
    """A landed LMCache copy against the tokens the plan asked for (chain x block size)."""
    asked = len(job.prefix_keys) * (job.target.block_size if job.target else 0)
    detail = f"{got} of the {asked} tokens asked for resident on {where} ({before} before)"
    if before >= asked:
        return redundant(job, f"{by}: the target held the prefix before the copy ({detail})")
    if got >= asked:
        return confirm(job, by, detail, asked, asked - before)
    if got > before:
        return confirm(job, by, detail, got, got - before)
    log.info("job %s landed; %s does not show it (%s)", job.pk, by, detail)
    return job


def on_landed(job: ReplicationJob, confirmation: dict | None = None) -> ReplicationJob:
    """Record the landed copy's replica; judge it now on the evidence already in."""
    _create_replica(job)
    try:
        reading = _reading(job, confirmation)
    except EventError as exc:
        log.warning("job %s: ignoring its result's confirmation: %s", job.pk, exc)
        reading = None
    if reading is not None:
        return _judge_reading(job, *reading)
    if job.transport in (Transport.LMCACHE, Transport.LMCACHE_MP):
        return job  # its evidence is the executor's reading; the sweep ends it unconfirmed
    return evaluate(job)


def on_agent_confirmation(job: ReplicationJob, msg: dict) -> ReplicationJob:
    """A ``job.confirm`` event: an LMCache executor's pin (renewal) or directory reading."""
    reading = _reading(job, msg)
    if reading is None:
        raise EventError("job.confirm needs a reading")
    by, got, before, where = reading
    if job.state == JobState.LANDED:
        return _judge_reading(job, by, got, before, where)
    if job.state in (JobState.CONFIRMED, JobState.PARTIAL):
        replica = replica_of(job)
        covers = replica.tokens if replica is not None else 0
        if got < covers:
            why = f"{by}: {got} of the {covers} tokens it covered resident on {where}"
            return lose(job, replica, why + (f" ({msg['error']})" if msg.get("error") else ""))
    return job


def on_residency_reported(node: int, seq: int, stored: dict[int, list[int]], **_signal) -> int:
    """An agent report was applied: blocks it stored on targets of copies awaiting evidence
    join those jobs' ``stored_since``, and each landed one is judged now. Connected to
    ``fleet.signals.residency_reported``. Returns how many jobs took evidence."""
    touched = 0
    with transaction.atomic():  # a savepoint inside the report's transaction
        jobs = (
            ReplicationJob.objects.select_for_update(of=("self",))
            .select_related("target")
            .filter(action=JobAction.REPLICATE, target_id__in=list(stored), state__in=AWAITING)
            .exclude(transport__in=(Transport.LMCACHE, Transport.LMCACHE_MP))
        )
        sets = {engine: set(keys) for engine, keys in stored.items()}
        for job in jobs:
            if job.target_report_seq is not None and seq <= job.target_report_seq:
                continue  # spooled before the target's agent took the job: not the copy's
            got = [k for k in _chain(job) if k in sets[job.target_id]]
            have = set(job.stored_since)
            new = [h for h in _hex(got) if h not in have]
            if not new:
                continue
            job.stored_since = [*job.stored_since, *new]
            job.stored_seqs = {**job.stored_seqs, **dict.fromkeys(new, seq)}
            job.save(update_fields=["stored_since", "stored_seqs", "updated_at"])
            touched += 1
            if job.state == JobState.LANDED:
                evaluate(job)
    return touched


def on_target_cut(job: ReplicationJob, report_seq: int) -> ReplicationJob:
    """The target's agent acknowledged the attempt after spooling report ``report_seq``: what
    that report and earlier ones stored was on the engine before the agent took the job (a
    report still on its way at dispatch), so it is no evidence of the copy."""
    early = {h for h, s in job.stored_seqs.items() if s <= report_seq}
    job.target_report_seq = report_seq
    job.stored_since = [h for h in job.stored_since if h not in early]
    job.stored_seqs = {h: s for h, s in job.stored_seqs.items() if h not in early}
    job.save(update_fields=["target_report_seq", "stored_since", "stored_seqs", "updated_at"])
    return job


def lose(job: ReplicationJob, replica: SpeculativeReplica | None, why: str) -> ReplicationJob:
    """Confirmed (or partial) -> lost: the copy left the engine before its hold ended."""
    now = timezone.now()
    job = transition(job, JobState.LOST, why)
    replica = replica or replica_of(job)
    if replica is not None and replica.lost_at is None:
        replica.lost_at = now
        replica.evicted_at = replica.evicted_at or now
        replica.save(update_fields=["lost_at", "evicted_at"])
    _publish(job, why)
    return job


def unconfirmed(job: ReplicationJob) -> ReplicationJob:
    limit = settings.PREWARM_REPLICA_CONFIRM_SECONDS
    why = f"the target engine showed nothing new from the copy within {limit:.0f}s of landing"
    job = transition(job, JobState.UNCONFIRMED, why)
    SpeculativeReplica.objects.filter(job=job, evicted_at__isnull=True).update(
        evicted_at=timezone.now()
    )
    _publish(job, why)
    return job


def sweep(now=None) -> dict:
    """Timeouts only (evidence is judged as reports arrive): landed copies past the
    confirmation window are judged for good; confirmed KV-event copies that left their engine
    are lost."""
    now = now or timezone.now()
    out = dict.fromkeys(
        (
            JobState.CONFIRMED,
            JobState.PARTIAL,
            JobState.REDUNDANT,
            JobState.UNCONFIRMED,
            JobState.LOST,
        ),
        0,
    )
    overdue = now - timedelta(seconds=settings.PREWARM_REPLICA_CONFIRM_SECONDS)
    for job in ReplicationJob.objects.filter(
        action=JobAction.REPLICATE, state=JobState.LANDED, updated_at__lte=overdue
    ).select_related("target"):
        with transaction.atomic():
            try:
                if job.transport in (Transport.LMCACHE, Transport.LMCACHE_MP):
                    job = unconfirmed(job)
                else:
                    job = evaluate(job, final=True)
            except IllegalTransition:
                continue  # judged meanwhile
        key = job.state if job.state in out else None
        if key:
            out[key] += 1
    live = list(
        SpeculativeReplica.objects.filter(
            shadow=False,
            held_out=False,
            confirmed_by=Confirmation.KV_EVENTS,
            lost_at__isnull=True,
            evicted_at__isnull=True,
            expires_at__gt=now,
            engine__residency_synced=True,
            job__state__in=(JobState.CONFIRMED, JobState.PARTIAL),
        ).select_related("job", "engine")
    )
    if live:
        index = get_index()
        chains = [_chain(r)[: max(1, r.tokens // max(1, r.engine.block_size))] for r in live]
        found = index.full_holders_many(chains, limit=HOLDERS_LIMIT)
        for replica, holders in zip(live, found, strict=True):
            if any(h.engine == replica.engine_id for h in holders):
                continue
            with transaction.atomic():
                try:
                    lose(
                        replica.job,
                        replica,
                        "the target's KV events no longer hold the blocks the copy covered",
                    )
                    out["lost"] += 1
                except IllegalTransition:
                    continue
    return out
