"""Agent enrolment and the nodes, engines and GPUs an admin changes: the fleet's service layer
(agent reports are applied by ``ingestion``)."""

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
from controlplane.core.errors import Conflict, Forbidden, Invalid
from controlplane.realtime import events
from controlplane.realtime.publish import publish_event

from .choices import TENANTS_LABEL, EngineLifecycle, NodeState
from .configured_index import get_index
from .ingestion import forget_engine_gpus
from .models import Engine, Gpu, Node

log = logging.getLogger(__name__)


class EnrolRefused(Forbidden):
    """An enrolment under a taken node name without that node's proof (403, audited)."""

    code = "node_name_taken"


REENROL_APPROVAL_S = 3600  # how long an admin's "allow re-enrolment" stays open


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
    node.reenrol_allowed_until = timezone.now() + timedelta(seconds=REENROL_APPROVAL_S)
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


@transaction.atomic
def reassign_gpu(gpu: Gpu, to: Node, who, *, reason: str = "") -> Gpu:
    """An admin gives ``gpu`` to node ``to`` (a GPU moved between hosts, or a squatter's claim
    undone): its old node's engines let go of it and the claim is cleared. Audited."""
    gpu = Gpu.objects.select_for_update().get(pk=gpu.pk)
    before = snapshot(gpu)
    if gpu.node_id != to.pk:
        for engine in gpu.engines.exclude(node=to):
            engine.gpus.remove(gpu)
            forget_engine_gpus(engine)
    gpu.node, gpu.claimed_by, gpu.claimed_at = to, None, None
    gpu.save(update_fields=["node", "claimed_by", "claimed_at", "updated_at"])
    record(who, "gpu.reassigned", gpu, before=before, after=snapshot(gpu), reason=reason)
    return gpu


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
