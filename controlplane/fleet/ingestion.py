"""Agent reports applied: a node's GPUs, engines and residency deltas written in one
transaction, the residency index updated last, and the node's agent told what to resend."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.audit.services import record
from controlplane.core.agent_report import Report
from controlplane.core.errors import Conflict, Forbidden
from controlplane.core.residency_index import Delta
from controlplane.realtime import events
from controlplane.realtime.publish import publish_event
from wire.protocol import MODE_SNAPSHOT

from .choices import NodeState
from .configured_index import get_index
from .models import Engine, Gpu, GpuSample, Node
from .signals import residency_reported

log = logging.getLogger(__name__)

GPU_SAMPLE_S = 60
GPU_REFRESH_S = 60  # an unchanged GPU row is rewritten (updated_at) at most this often
ENGINE_SEEN_S = 10  # an unchanged engine's last_seen is written at most this often
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


def apply_report(node: Node, report: Report) -> dict:
    """Apply one validated report atomically; returns the response body."""
    now = timezone.now()
    with transaction.atomic():
        node, new_boot = _lock_reporting_node(node, report)
        if get_index().mark_live():
            # The index is new or lost everything (Redis restarted empty): what it held must be
            # reported again, so every engine of every node sends a snapshot next.
            Engine.objects.update(residency_synced=False)
        refused: list[str] = []
        gpus = _upsert_gpus(node, report.gpus, now, refused) if report.gpus else {}
        engines = _upsert_engines(node, report.engines, gpus, now)
        deltas, requested, synced = _residency_deltas(report, engines, now)
        if new_boot and node.boot_id:
            # A restarted agent: everything it said before may be stale until it resyncs.
            requested.extend(
                e.engine_id
                for e in engines.values()
                if e.pk not in synced and e.engine_id not in requested
            )
        _write_synced(node, engines, requested, synced)
        _save_reporting_node(node, report, now)
        # Last, so a failure here rolls the database back; re-applying the same deltas is harmless.
        changes = get_index().apply(deltas)
        _announce_stored(node, report, deltas)
        if changes or report.gpus:
            _publish_residency(node, report, engines, refused, now)
    return {
        "applied_seq": report.seq,
        "snapshot_requested": sorted(set(requested)),
        "server_time": now.timestamp(),
        "deltas_applied": changes,
        "gpus_refused": refused,  # uuids another node owns (an admin may reassign them)
    }


def _lock_reporting_node(node: Node, report: Report) -> tuple[Node, bool]:
    """The node's row, locked for the report; whether the report comes from a new agent boot.
    A retired node, or a seq not after the last one applied (unless a new boot's snapshot), is
    refused."""
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
    return node, new_boot


def _residency_deltas(
    report: Report, engines: dict[str, Engine], now
) -> tuple[list[Delta], list[str], list[int]]:
    """The report's residency as index deltas; the engines to ask for a snapshot (engine ids)
    and those that sent one (pks). An engine-scoped count is written as it comes."""
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
    return deltas, requested, synced


def _write_synced(
    node: Node, engines: dict[str, Engine], requested: list[str], synced: list[int]
) -> None:
    """Every engine not in sync and without a snapshot in this report is asked for one
    (appended to ``requested``); the engines' ``residency_synced`` flags are written where they
    change."""
    engines_by_pk = {e.pk: e for e in engines.values()}
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
        Engine.objects.filter(node=node, engine_id__in=unsynced_now).update(residency_synced=False)


def _save_reporting_node(node: Node, report: Report, now) -> None:
    """The report's seq, boot and time on the node (a stale node is active again)."""
    node.last_seq, node.boot_id, node.last_seen = report.seq, report.boot_id, now
    if node.state == NodeState.STALE:
        node.state = NodeState.ACTIVE
    node.reports_applied += 1
    fields = ["last_seq", "boot_id", "last_seen", "state", "reports_applied"]
    if report.transports is not None and report.transports != node.transports:
        node.transports = report.transports
        fields.append("transports")
    node.save(update_fields=fields)


def _announce_stored(node: Node, report: Report, deltas: list[Delta]) -> None:
    """``residency_reported`` with the blocks each engine stored (job confirmation listens)."""
    stored = {d.engine: [row[0] for row in d.stored] for d in deltas if d.stored}
    if stored:
        # Receivers run in a savepoint each (send_robust logs and swallows their errors):
        # a confirmation that fails never refuses an agent's report.
        for receiver, result in residency_reported.send_robust(
            sender=apply_report, node=node.pk, seq=report.seq, stored=stored
        ):
            if isinstance(result, Exception):
                log.error("residency_reported receiver %r failed: %s", receiver, result)


def _publish_residency(
    node: Node, report: Report, engines: dict[str, Engine], refused: list[str], now
) -> None:
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
            # anyway); updated_at is still refreshed every GPU_REFRESH_S.
            differs = _take_changes(gpu, data, GPU_FIELDS, gpu.updated_at, GPU_REFRESH_S, now)
            if differs is not None:
                changed.append((gpu, differs))
        if now.timestamp() - _last_sample_at.get(_gpu_key(node, gpu), 0.0) >= GPU_SAMPLE_S:
            samples.append(
                GpuSample(
                    gpu=gpu,
                    at=now,
                    memory_used=data["memory_used"],
                    utilization_gpu=data["utilization_gpu"],
                )
            )
    # Usually one GPU row or none: plain UPDATEs beat bulk_update's CASE.
    for gpu, differs in changed:
        Gpu.objects.filter(pk=gpu.pk).update(
            updated_at=now, **{f: getattr(gpu, f) for f in differs}
        )
        gpu.updated_at = now
    if samples:  # at most one history point per GPU per GPU_SAMPLE_S
        recent = dict(
            GpuSample.objects.filter(
                gpu__in=[s.gpu for s in samples], at__gt=now - timedelta(seconds=GPU_SAMPLE_S)
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
            differs = _take_changes(
                engine, data, ENGINE_FIELDS, engine.last_seen, ENGINE_SEEN_S, now
            )
            if differs is not None:
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


def _take_changes(row, data: dict, fields: tuple, written_at, every_s: float, now) -> list | None:
    """The ``fields`` whose values ``data`` changes, set on ``row``; None where none changed and
    the row was written less than ``every_s`` ago (nothing to write)."""
    differs = [f for f in fields if getattr(row, f) != data[f]]
    if not differs and written_at is not None and (now - written_at).total_seconds() < every_s:
        return None
    for f in differs:
        setattr(row, f, data[f])
    return differs


def forget_engine_gpus(engine: Engine) -> None:
    """Drop this process's memory of ``engine``'s GPUs as written (an admin moved one): its next
    report reads them from the database."""
    _engine_gpus.pop((engine.pk, engine.created_at), None)
