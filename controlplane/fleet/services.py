"""Agent enrolment and report application: the service layer behind the agent endpoints."""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken, EnrolmentToken, digest
from controlplane.accounts.services import revoke_node_tokens
from controlplane.audit.services import record, save_audited, snapshot
from controlplane.core.agent_report import Report
from controlplane.core.errors import Conflict, Forbidden, Invalid
from controlplane.core.residency import Delta
from controlplane.realtime import events
from controlplane.realtime.publish import publish_event
from wire.protocol import MODE_SNAPSHOT

from .choices import TENANTS_LABEL, EngineLifecycle, NodeState
from .models import Engine, Gpu, GpuSample, Node
from .residency import get_index
from .signals import residency_reported

log = logging.getLogger(__name__)

GPU_SAMPLE_SECONDS = 60
GPU_REFRESH_SECONDS = 60  # an unchanged GPU row is rewritten (updated_at) at most this often
ENGINE_SEEN_SECONDS = 10  # an unchanged engine's last_seen is written at most this often
GPU_FIELDS = (
    "index",
    "name",
    "memory_total",
    "memory_used",
    "memory_free",
    "utilization_gpu",
    "nvlink_peers",
    "pcie",
    "processes",
    "errors",
    "lost",
)
ENGINE_FIELDS = (
    "kind",
    "model",
    "block_size",
    "bytes_per_block",
    "kv_capacity_blocks",
    "endpoints",
    "metrics",
    "doctor",
)


class EnrolRefused(Forbidden):
    """An enrolment under a taken node name without that node's proof (403, audited)."""

    code = "node_name_taken"


REENROL_APPROVAL_SECONDS = 3600  # how long an admin's "allow re-enrolment" stays open


def enrol(
    raw_token: str,
    hostname: str,
    labels: dict,
    *,
    node_secret: str = "",
    agent_token: str = "",
    ip: str = "",
) -> tuple[Node, str, str]:
    """Trade an enrolment token (one of its ``max_uses``) for a node, its agent token and its
    enrolment secret (both shown once). A new name makes a node; a taken name is re-enrolled
    only with that node's own proof: its enrolment secret (kept in the agent's state), its
    current agent token, an enrolment token bound to the name, or an admin's approval
    (``allow_reenrolment``). Anything else is refused, and the refusal audited."""
    try:
        return _enrol(raw_token, hostname, labels, node_secret, agent_token)
    except EnrolRefused as exc:
        # Its own transaction: the refused enrolment's was rolled back.
        record(
            None,
            "node.enrol_refused",
            object_type="fleet.node",
            object_id=str(exc.extra.pop("node_id", "")),
            after={"name": hostname, "address": ip},
            reason=exc.detail,
            actor_label=f"enrolment token {exc.extra.pop('token_prefix', '')}…",
        )
        raise


def _proof(node: Node, token: EnrolmentToken, node_secret: str, agent_token: str, now) -> str:
    """How the caller proved it is ``node`` (for the audit), or ""."""
    if node_secret and node.enrol_secret_digest and digest(node_secret) == node.enrol_secret_digest:
        return "its enrolment secret"
    if agent_token:
        held = ApiToken.objects.filter(
            digest=digest(agent_token), node=node, kind=TokenKind.AGENT
        ).first()
        if held is not None and held.usable:
            return f"its agent token {held.prefix}…"
    if token.node_name == node.name:
        return "an enrolment token bound to its name"
    if node.reenrol_allowed_until and node.reenrol_allowed_until > now:
        return "an admin's approval"
    return ""


@transaction.atomic
def _enrol(
    raw_token: str, hostname: str, labels: dict, node_secret: str, agent_token: str
) -> tuple[Node, str, str]:
    token = EnrolmentToken.objects.select_for_update().filter(digest=digest(raw_token)).first()
    now = timezone.now()
    if token is None or not token.usable_at(now):
        raise Forbidden(
            "enrolment token is unknown, used or expired",
            code="invalid_enrolment_token",
            field="enrolment_token",
        )
    if token.node_name and token.node_name != hostname:
        raise EnrolRefused(
            f"this enrolment token is bound to node {token.node_name!r}",
            code="enrolment_token_bound",
            field="hostname",
            token_prefix=token.prefix,
        )
    labels = {k: v for k, v in labels.items() if k != TENANTS_LABEL}  # an admin's to set
    node = Node.objects.select_for_update().filter(name=hostname).first()
    secret = secrets.token_urlsafe(32)
    if node is None:
        node = Node.objects.create(
            name=hostname, labels={**labels, **token.labels}, enrol_secret_digest=digest(secret)
        )
        how = "new node"
    else:
        how = _proof(node, token, node_secret, agent_token, now)
        if not how:
            raise EnrolRefused(
                f"node {hostname!r} is enrolled: re-enrolling it needs its enrolment secret or "
                "agent token (kept in the agent's state), an enrolment token bound to its name, "
                "or an admin's approval",
                field="hostname",
                node_id=node.pk,
                token_prefix=token.prefix,
            )
        # Re-enrolling a host (a reinstalled agent): its old tokens stop working, open channels
        # included.
        revoke_node_tokens(node.pk)
        node.labels = {**node.labels, **labels, **token.labels}
        node.last_seq, node.boot_id, node.state = 0, "", NodeState.ACTIVE
        node.enrol_secret_digest, node.reenrol_allowed_until = digest(secret), None
        node.save()
        for engine in node.engines.all():
            get_index().drop_engine(engine.pk)
        node.engines.update(residency_synced=False)
    _, raw = ApiToken.issue(TokenKind.AGENT, f"agent:{hostname}", node=node)
    token.used_at, token.node, token.uses = now, node, token.uses + 1
    token.save(update_fields=["used_at", "node", "uses"])
    record(
        None,
        "node.enrolled",
        node,
        after={"name": node.name, "labels": node.labels},
        reason=f"enrolment token {token.prefix}… (use {token.uses} of {token.max_uses}); {how}",
    )
    return node, raw, secret


@transaction.atomic
def allow_reenrolment(node: Node, who, *, reason: str = "") -> Node:
    """An admin's approval: for the next hour, any usable enrolment token may re-enrol ``node``
    once (a host rebuilt without its agent's state)."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    node.reenrol_allowed_until = timezone.now() + timedelta(seconds=REENROL_APPROVAL_SECONDS)
    node.save(update_fields=["reenrol_allowed_until"])
    record(
        who,
        "node.reenrolment_allowed",
        node,
        after={"until": node.reenrol_allowed_until.isoformat()},
        reason=reason,
    )
    return node


@transaction.atomic
def rotate_agent_token(node: Node, current: ApiToken | None, who=None) -> str:
    """A new agent token for ``node``; ``current`` (or, from an admin, every token of the node)
    stops working in the same transaction, and the sockets and long-polls it holds open are
    closed on commit. Returns the raw token, shown once."""
    prefixes = [t.prefix for t in revoke_node_tokens(node.pk, only=current)]
    token, raw = ApiToken.issue(TokenKind.AGENT, f"agent:{node.name}", node=node)
    record(
        who,
        "node.token_rotated",
        node,
        after={"prefix": token.prefix},
        reason=f"revoked {', '.join(p + '…' for p in prefixes) or 'none'}",
    )
    return raw


@transaction.atomic
def update_node(node: Node, who, fields: list[str], *, reason: str = "") -> Node:
    """Save an admin's change to ``fields`` of a node (labels; state: retiring it), audited.
    Only those fields are written: the node's agent updates the same row. Retiring revokes the
    node's agent tokens (its open sockets and long-polls close) and drops its residency."""
    if "state" in fields and node.state not in (NodeState.RETIRED, _stored_state(node)):
        raise Invalid(
            "a node's state is set by its agent; admins may only retire it", field="state"
        )
    retiring = node.state == NodeState.RETIRED and _stored_state(node) != NodeState.RETIRED
    node = save_audited(node, who, "node.updated", reason=reason, update_fields=fields)
    if retiring:
        retire_node(node, who, reason=reason)
    return node


def _stored_state(node: Node) -> str:
    return Node.objects.filter(pk=node.pk).values_list("state", flat=True).first() or ""


@transaction.atomic
def retire_node(node: Node, who, *, reason: str = "") -> Node:
    """Retire ``node``: its agent tokens are revoked (open sockets and long-polls closed), its
    engines leave the residency index, and it is refused from then on. Audited."""
    revoked = revoke_node_tokens(node.pk)
    # Its enrolment secret goes too: the agent must not simply enrol itself back.
    Node.objects.filter(pk=node.pk).update(
        state=NodeState.RETIRED, enrol_secret_digest="", reenrol_allowed_until=None
    )
    node.state = NodeState.RETIRED
    engine_ids = list(node.engines.values_list("pk", flat=True))
    Engine.objects.filter(pk__in=engine_ids).update(residency_synced=False)
    for engine_id in engine_ids:
        get_index().drop_engine(engine_id)
    record(
        who,
        "node.retired",
        node,
        after={"revoked": [t.prefix for t in revoked]},
        reason=reason,
    )
    return node


@transaction.atomic
def change_engine_lifecycle(engine: Engine, to: str, who, *, reason: str = "") -> Engine:
    """Move an engine to lifecycle ``to`` if EngineLifecycle.ALLOWED permits it, audited.
    Setting the state it is already in is allowed (and recorded)."""
    engine = Engine.objects.select_for_update().get(pk=engine.pk)
    if to not in dict(EngineLifecycle.CHOICES):
        raise Invalid(f"unknown lifecycle {to!r}", field="lifecycle")
    if to != engine.lifecycle and to not in EngineLifecycle.ALLOWED[engine.lifecycle]:
        raise Conflict(
            f"{engine.lifecycle} -> {to} is not allowed",
            code="illegal_lifecycle",
            field="lifecycle",
        )
    before = snapshot(engine)
    engine.lifecycle = to
    engine.save(update_fields=["lifecycle"])
    record(who, "engine.lifecycle", engine, before=before, after=snapshot(engine), reason=reason)
    return engine


def _mark_lost(node: Node, gpus: list[dict]) -> None:
    for data in gpus:
        Gpu.objects.filter(node=node, index=data["index"]).update(lost=True, errors=data["errors"])


# Per-process memory of what this process last wrote, so an unchanged report writes nothing.
# Only ever a shortcut: a process without an entry (new, or another process wrote) reads the
# database, and entries are set on commit, so a rolled-back report leaves nothing behind.
# Keys carry a creation time besides the pk, so a reused pk (database reset) never hits.
_last_sample_at: dict[tuple, float] = {}  # (gpu pk, uuid, node created) -> last GpuSample time
_engine_gpus: dict[tuple, frozenset[int]] = {}  # (engine pk, created) -> its GPU pks as written


def _on_commit_set(cache: dict, key, value) -> None:
    transaction.on_commit(lambda: cache.__setitem__(key, value))


def _gpu_key(node: Node, gpu: Gpu) -> tuple:
    return (gpu.pk, gpu.uuid, node.created_at)


def _claim(gpu: Gpu, node: Node, now) -> None:
    """``node`` reported ``gpu``, which another node owns: shown to admins (written and audited
    once per claimant, not on every report)."""
    if gpu.claimed_by_id == node.pk:
        return
    Gpu.objects.filter(pk=gpu.pk).update(claimed_by=node, claimed_at=now)
    record(
        None,
        "gpu.claim_refused",
        gpu,
        after={"uuid": gpu.uuid, "owner": gpu.node_id, "claimed_by": node.pk},
        reason=f"node {node.name} reported a GPU node #{gpu.node_id} owns",
        actor_label=f"agent:{node.name}",
    )


@transaction.atomic
def reassign_gpu(gpu: Gpu, to: Node, who, *, reason: str = "") -> Gpu:
    """An admin gives ``gpu`` to node ``to`` (a GPU moved between hosts, or a squatter's claim
    undone): its old node's engines let go of it and the claim is cleared. Audited."""
    gpu = Gpu.objects.select_for_update().get(pk=gpu.pk)
    before = snapshot(gpu)
    if gpu.node_id != to.pk:
        for engine in gpu.engines.exclude(node=to):
            engine.gpus.remove(gpu)
            _engine_gpus.pop((engine.pk, engine.created_at), None)
    gpu.node, gpu.claimed_by, gpu.claimed_at = to, None, None
    gpu.save(update_fields=["node", "claimed_by", "claimed_at", "updated_at"])
    record(who, "gpu.reassigned", gpu, before=before, after=snapshot(gpu), reason=reason)
    return gpu


def _upsert_gpus(node: Node, gpus: list[dict], now, refused: list[str]) -> dict[str, Gpu]:
    """Write the node's GPUs; the uuids another node owns are appended to ``refused`` and left
    out of what is returned (its engines do not get them)."""
    _mark_lost(node, [g for g in gpus if g["uuid"] is None])
    gpus = [g for g in gpus if g["uuid"] is not None]
    existing = {g.uuid: g for g in Gpu.objects.filter(uuid__in=[g["uuid"] for g in gpus])}
    changed, samples = [], []
    for data in gpus:
        gpu = existing.get(data["uuid"])
        if gpu is None:
            gpu = Gpu.objects.create(
                node=node, uuid=data["uuid"], **{f: data[f] for f in GPU_FIELDS}
            )
            existing[gpu.uuid] = gpu
        else:
            if gpu.node_id != node.pk:
                # Refused for this GPU only (the rest of the report applies): a GPU belongs to
                # the node that reported it first until an admin reassigns it (reassign_gpu).
                _claim(gpu, node, now)
                refused.append(gpu.uuid)
                continue
            # Unchanged values are not rewritten (live values reach browsers through publish
            # anyway); updated_at is still refreshed every GPU_REFRESH_SECONDS.
            differs = [f for f in GPU_FIELDS if getattr(gpu, f) != data[f]]
            stale = (
                gpu.updated_at is None
                or (now - gpu.updated_at).total_seconds() >= GPU_REFRESH_SECONDS
            )
            if differs or stale:
                for f in differs:
                    setattr(gpu, f, data[f])
                changed.append((gpu, differs))
        if now.timestamp() - _last_sample_at.get(_gpu_key(node, gpu), 0.0) >= GPU_SAMPLE_SECONDS:
            samples.append(
                GpuSample(
                    gpu=gpu,
                    at=now,
                    memory_used=data["memory_used"],
                    utilization_gpu=data["utilization_gpu"],
                )
            )
    for (
        gpu,
        differs,
    ) in changed:  # usually one GPU row or none: plain UPDATEs beat bulk_update's CASE
        Gpu.objects.filter(pk=gpu.pk).update(
            updated_at=now, **{f: getattr(gpu, f) for f in differs}
        )
        gpu.updated_at = now
    if samples:  # at most one history point per GPU per GPU_SAMPLE_SECONDS
        recent = dict(
            GpuSample.objects.filter(
                gpu__in=[s.gpu for s in samples], at__gt=now - timedelta(seconds=GPU_SAMPLE_SECONDS)
            ).values_list("gpu_id", "at")
        )
        for sample in samples:
            at = recent.get(sample.gpu.pk)
            _on_commit_set(_last_sample_at, _gpu_key(node, sample.gpu), (at or now).timestamp())
        GpuSample.objects.bulk_create([s for s in samples if s.gpu.pk not in recent])
    return {u: g for u, g in existing.items() if g.node_id == node.pk}


def _upsert_engines(
    node: Node, engines: list[dict], gpus: dict[str, Gpu], now
) -> dict[str, Engine]:
    existing = {e.engine_id: e for e in node.engines.all()}
    for data in engines:
        engine = existing.get(data["engine_id"])
        if engine is None:
            engine = Engine.objects.create(
                node=node,
                engine_id=data["engine_id"],
                last_seen=now,
                **{f: data[f] for f in ENGINE_FIELDS},
            )
            existing[engine.engine_id] = engine
        else:
            differs = [f for f in ENGINE_FIELDS if getattr(engine, f) != data[f]]
            stale = (
                engine.last_seen is None
                or (now - engine.last_seen).total_seconds() >= ENGINE_SEEN_SECONDS
            )
            if differs or stale:
                for f in differs:
                    setattr(engine, f, data[f])
                engine.last_seen = now
                Engine.objects.filter(pk=engine.pk).update(
                    last_seen=now, **{f: data[f] for f in differs}
                )
        wanted = frozenset(gpus[u].pk for u in data["gpu_uuids"] if u in gpus)
        if wanted and wanted != _engine_gpus.get((engine.pk, engine.created_at)):
            if wanted != {g.pk for g in engine.gpus.all()}:
                engine.gpus.set(wanted)
            _on_commit_set(_engine_gpus, (engine.pk, engine.created_at), wanted)
    return existing


def apply_report(node: Node, report: Report) -> dict:
    """Apply one validated report atomically; returns the response body."""
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if node.state == NodeState.RETIRED:
            raise Forbidden("this node is retired", code="node_retired")
        new_boot = node.boot_id != report.boot_id
        if report.seq <= node.last_seq and not (new_boot and report.snapshot_only):
            raise Conflict(
                f"seq {report.seq} is not after {node.last_seq}",
                code="stale_seq",
                field="seq",
                last_seq=node.last_seq,
            )
        if get_index().mark_live():
            # The index is new or lost everything (Redis restarted empty): what it held must be
            # reported again, so every engine of every node sends a snapshot next.
            Engine.objects.update(residency_synced=False)
        refused: list[str] = []
        gpus = _upsert_gpus(node, report.gpus, now, refused) if report.gpus else {}
        engines = _upsert_engines(node, report.engines, gpus, now)
        engines_by_pk = {e.pk: e for e in engines.values()}
        deltas, requested, synced = [], [], []
        for res in report.residency:
            engine = engines[res.engine_id]
            snapshot = res.mode == MODE_SNAPSHOT
            deltas.append(
                Delta(
                    engine.pk,
                    stored=res.stored,
                    removed=res.removed,
                    cleared=res.cleared,
                    snapshot=snapshot,
                )
            )
            if res.engine_scoped:  # rare (no token ids, e.g. CPU offload): written only then
                Engine.objects.filter(pk=engine.pk).update(
                    engine_scoped_at=now, engine_scoped_blocks=res.engine_scoped
                )
            if snapshot:
                synced.append(engine.pk)
            elif not engine.residency_synced:
                requested.append(engine.engine_id)
        if new_boot and node.boot_id:
            # A restarted agent: everything it said before may be stale until it resyncs.
            requested.extend(
                e.engine_id
                for e in engines.values()
                if e.pk not in synced and e.engine_id not in requested
            )
        for engine in engines.values():
            if (
                not engine.residency_synced
                and engine.engine_id not in requested
                and engine.pk not in synced
            ):
                requested.append(engine.engine_id)
        synced_now = [pk for pk in synced if not engines_by_pk[pk].residency_synced]
        if synced_now:
            Engine.objects.filter(pk__in=synced_now).update(residency_synced=True)
        unsynced_now = [e for e in requested if engines[e].residency_synced]
        if unsynced_now:
            Engine.objects.filter(node=node, engine_id__in=unsynced_now).update(
                residency_synced=False
            )
        node.last_seq, node.boot_id, node.last_seen = report.seq, report.boot_id, now
        if node.state == NodeState.STALE:
            node.state = NodeState.ACTIVE
        node.reports_applied += 1
        fields = ["last_seq", "boot_id", "last_seen", "state", "reports_applied"]
        if report.transports is not None and report.transports != node.transports:
            node.transports = report.transports
            fields.append("transports")
        node.save(update_fields=fields)
        # Last, so a failure here rolls the database back; re-applying the same deltas is harmless.
        changes = get_index().apply(deltas)
        stored = {d.engine: [row[0] for row in d.stored] for d in deltas if d.stored}
        if stored:
            # Receivers run in a savepoint each (send_robust logs and swallows their errors):
            # a confirmation that fails never refuses an agent's report.
            for receiver, result in residency_reported.send_robust(
                sender=apply_report, node=node.pk, seq=report.seq, stored=stored
            ):
                if isinstance(result, Exception):
                    log.error("residency_reported receiver %r failed: %s", receiver, result)
        if changes or report.gpus:
            publish_event(
                events.residency_delta(
                    node.pk,
                    {
                        str(engines[r.engine_id].pk): {
                            "stored": len(r.stored),
                            "removed": len(r.removed),
                            "mode": r.mode,
                        }
                        for r in report.residency
                    },
                    [
                        {
                            "uuid": g["uuid"],
                            "memory_used": g["memory_used"],
                            "memory_total": g["memory_total"],
                        }
                        for g in report.gpus
                        if g["uuid"] not in refused
                    ],
                    now.timestamp(),
                )
            )
    return {
        "applied_seq": report.seq,
        "snapshot_requested": sorted(set(requested)),
        "server_time": now.timestamp(),
        "deltas_applied": changes,
        "gpus_refused": refused,  # uuids another node owns (an admin may reassign them)
    }


def heartbeat(node: Node) -> None:
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(last_seen=now)
    Node.objects.filter(pk=node.pk, state=NodeState.STALE).update(state=NodeState.ACTIVE)


def mark_stale_nodes() -> list[int]:
    """Nodes silent for longer than the limit go stale and leave the residency index."""
    cutoff = timezone.now() - timedelta(seconds=settings.PREWARM_NODE_STALE_SECONDS)
    stale = list(
        Node.objects.filter(state=NodeState.ACTIVE, last_seen__lt=cutoff).values_list(
            "pk", flat=True
        )
    )
    for node_id in stale:
        with transaction.atomic():
            Node.objects.filter(pk=node_id).update(state=NodeState.STALE)
            engine_ids = list(Engine.objects.filter(node_id=node_id).values_list("pk", flat=True))
            Engine.objects.filter(pk__in=engine_ids).update(residency_synced=False)
            for engine_id in engine_ids:
                get_index().drop_engine(engine_id)
            record(
                None,
                "node.stale",  # not-vocabulary: the audit action of the same name
                object_type="fleet.node",
                object_id=str(node_id),
                reason=f"no report for {settings.PREWARM_NODE_STALE_SECONDS:.0f}s",
            )
            publish_event(events.node_stale(node_id))
    return stale
