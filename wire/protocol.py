"""The agent <-> control plane wire vocabulary (docs/agent-protocol.md), spelled once.

Standard library only: it ships to the agent image beside ``blockhash.py``, and both sides import
it, so a tier, a flag, a job state or a message type has exactly one spelling. The report row
layout has one encoder (``encode_stored`` / ``encode_removed``, used by the agent) and one decoder
(``decode_stored`` / ``decode_removed``, used by the server's report parser).

Keys are unsigned 64-bit integers. In msgpack they travel as integers (the compact form agents
send); in JSON as 16-digit lower-case hex strings, because browsers' numbers cannot hold them.
The decoder accepts both in either encoding, so agents older than integer keys in msgpack (hex
everywhere) keep working.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# -- tiers (a block's medium) ----------------------------------------------------------------
TIER_GPU = "GPU"
TIER_CPU = "CPU"
TIER_DISK = "DISK"
TIERS = (TIER_GPU, TIER_CPU, TIER_DISK)  # fastest first
TIER_RANK = {t: i for i, t in enumerate(TIERS)}  # lower = faster

# -- report rows -----------------------------------------------------------------------------
FLAG_ENGINE_SCOPED = 1  # the key is only meaningful on its engine (no token ids were available)
FLAGS_MAX = 255
KEY_MAX = 2**64 - 1
MODE_DELTA = "delta"
MODE_SNAPSHOT = "snapshot"
MODES = (MODE_DELTA, MODE_SNAPSHOT)
CONTENT_MSGPACK = "application/msgpack"
CONTENT_JSON = "application/json"
ENCODING_MSGPACK = "msgpack"
ENCODING_JSON = "json"

# A stored row on the wire: [key, parent key or null, medium, flags]; a removed row: [key, medium].
StoredRow = tuple[int, "int | None", str, int]
RemovedRow = tuple[int, str]

# -- replication jobs ------------------------------------------------------------------------
MSG_JOB_ASSIGN = "job.assign"  # server -> agent
MSG_JOB_CANCEL = "job.cancel"  # server -> agent
MSG_JOB_ACK = "job.ack"  # agent -> server
MSG_JOB_PROGRESS = "job.progress"  # agent -> server
MSG_JOB_RESULT = "job.result"  # agent -> server
MSG_JOB_CONFIRM = "job.confirm"  # agent -> server: its engine shows a landed copy (LMCache pin)
MSG_ERROR = "error"  # server -> agent: a message it could not apply
AGENT_MESSAGES = (MSG_JOB_ACK, MSG_JOB_PROGRESS, MSG_JOB_RESULT, MSG_JOB_CONFIRM)
# The largest message the jobs websocket carries: the agents' client and the server (daphne's
# --websocket-max-message-size) are both set to it, and the server sends nothing larger. A warm-up
# job carries its prefix's token ids: a 128k-token prefix is ~1.3 MB of JSON, over the 1 MiB both
# ends default to (the burst demo's agents reconnected in a loop, sent the same job each time).
SOCKET_MESSAGE_MAX_BYTES = 16 << 20

ROLE_SOURCE = "source"
ROLE_TARGET = "target"
ROLES = (ROLE_SOURCE, ROLE_TARGET)

ACTION_REPLICATE = "replicate"
ACTION_EVICT = "evict"
ACTIONS = (ACTION_REPLICATE, ACTION_EVICT)

TRANSPORT_TCP = "tcp"
TRANSPORT_NCCL = "nccl"
TRANSPORT_LMCACHE = "lmcache"
TRANSPORT_LMCACHE_MP = "lmcache-mp"
TRANSPORT_WARMUP = "warmup"
TRANSPORTS = (
    TRANSPORT_TCP,
    TRANSPORT_NCCL,
    TRANSPORT_LMCACHE,
    TRANSPORT_LMCACHE_MP,
    TRANSPORT_WARMUP,
)

JOB_PENDING = "pending"
JOB_APPROVED = "approved"
JOB_DISPATCHED = "dispatched"
JOB_RUNNING = "running"
JOB_LANDED = "landed"  # the executor says the copy is done
JOB_CONFIRMED = "confirmed"  # the target engine shows it (KV events, LMCache pin or directory)
JOB_UNCONFIRMED = "unconfirmed"  # landed, never shown within the confirmation window
JOB_LOST = "lost"  # confirmed, then left the engine before its hold ended
JOB_SUCCEEDED = "succeeded"
JOB_FAILED = "failed"
JOB_CANCELLED = "cancelled"
JOB_EXPIRED = "expired"
JOB_REDUNDANT = "redundant"  # the target already held what the copy would have placed: no replica
JOB_PARTIAL = "partial"  # the target shows part of the prefix new since dispatch: scored on that
JOB_STATES = (
    JOB_PENDING,
    JOB_APPROVED,
    JOB_DISPATCHED,
    JOB_RUNNING,
    JOB_LANDED,
    JOB_CONFIRMED,
    JOB_UNCONFIRMED,
    JOB_LOST,
    JOB_SUCCEEDED,
    JOB_FAILED,
    JOB_CANCELLED,
    JOB_EXPIRED,
    JOB_REDUNDANT,
    JOB_PARTIAL,
)
RESULT_STATES = (JOB_SUCCEEDED, JOB_FAILED)  # what a job.result may say

# Job-state groups (one definition each; the planner, the budgets and the pages read these).
JOB_IN_FLIGHT = (JOB_APPROVED, JOB_DISPATCHED, JOB_RUNNING)  # approved and moving, not yet landed
JOB_LIVE = (JOB_PENDING, *JOB_IN_FLIGHT)  # not final and not yet landed (pending counts)

# Engine lifecycle: what an engine does with traffic (the fleet's, the planner's, the simulator's).
ENGINE_WARMING = "warming"  # joining: not yet taking traffic, may receive copies
ENGINE_SERVING = "serving"
ENGINE_DRAINING = "draining"  # leaving (or not yet booted): no traffic, no new copies
ENGINE_LIFECYCLES = (ENGINE_WARMING, ENGINE_SERVING, ENGINE_DRAINING)

# What showed a landed copy on its target engine (a job's confirmation source).
CONFIRM_KV_EVENTS = "kv-events"  # the target engine's KV events reached the residency index
CONFIRM_LMCACHE_PIN = "lmcache-pin"  # LMCache /pin on the target reported the resident length
CONFIRM_LMCACHE_DIRECTORY = "lmcache-directory"  # the coordinator's directory lists the target

# API token kinds.
TOKEN_USER = "user"
TOKEN_GATEWAY = "gateway"
TOKEN_AGENT = "agent"

# Realtime (Channels) event names sent to the dashboard groups (controlplane/realtime/groups.py).
EVENT_PLAN_CREATED = "plan.created"
EVENT_PLAN_DECIDED = "plan.decided"
EVENT_JOB_UPDATE = "job.update"
EVENT_NODE_STALE = "node.stale"
EVENT_RESIDENCY_DELTA = "residency.delta"
EVENT_ENGINE_READINESS = "engine.readiness"

# The ``job`` object of a ``job.assign`` (docs/agent-protocol.md, "Replication jobs"): built by
# ``job_assign`` below, read by the agent's ``nodeagent.transfers.base.Job.from_message``.
FIELD_LMCACHE = TRANSPORT_LMCACHE  # the lmcache / lmcache-mp executors' parameters
LMCACHE_FIELDS = (  # what the agent reads; the control plane sends all but world_size (default 1)
    "source_instance",
    "source_location",
    "target_instance",
    "model_name",
    "world_size",
)
JOB_ASSIGN_FIELDS = (
    "id",
    "action",
    "role",
    "transport",
    "keys",
    "bytes",
    "bytes_per_block",
    ROLE_SOURCE,
    ROLE_TARGET,
    "rendezvous",
    FIELD_LMCACHE,
    "tokens",
    "block_size",
    "hold_until",
    "secret",
    "deadline",
    "attempt",
)


def job_assign(
    *,
    job_id: str,
    action: str,
    role: str,
    transport: str,
    keys: Iterable[int | str],
    nbytes: int,
    bytes_per_block: int,
    source: dict[str, Any],
    target: dict[str, Any],
    rendezvous: dict[str, Any],
    lmcache: dict[str, Any],
    tokens: list[int],
    block_size: int,
    hold_until: float,
    secret: str,
    deadline: float | None,
    attempt: int,
) -> dict[str, Any]:
    """A ``job.assign`` for one role. Keys in their JSON form (hex), whichever form is given;
    ``lmcache`` holds only ``LMCACHE_FIELDS``. ProtocolError on a value the agent would refuse."""
    if action not in ACTIONS:
        raise ProtocolError("job.action", f"{action!r} is not one of {', '.join(ACTIONS)}")
    if role not in ROLES:
        raise ProtocolError("job.role", f"{role!r} is not one of {', '.join(ROLES)}")
    if transport not in TRANSPORTS:
        raise ProtocolError("job.transport", f"{transport!r} is not one of {', '.join(TRANSPORTS)}")
    extra = sorted(set(lmcache) - set(LMCACHE_FIELDS))
    if extra:
        raise ProtocolError(f"job.{FIELD_LMCACHE}", f"unknown fields {extra}")
    job = {
        "id": job_id,
        "action": action,
        "role": role,
        "transport": transport,
        "keys": [key_hex(decode_key(k, f"job.keys[{i}]")) for i, k in enumerate(keys)],
        "bytes": nbytes,
        "bytes_per_block": bytes_per_block,
        ROLE_SOURCE: source,
        ROLE_TARGET: target,
        "rendezvous": rendezvous,
        FIELD_LMCACHE: lmcache,
        "tokens": tokens,
        "block_size": block_size,
        "hold_until": hold_until,
        "secret": secret,
        "deadline": deadline,
        "attempt": attempt,
    }
    return {"type": MSG_JOB_ASSIGN, "job": job}


def job_ack(job_id: str, report_seq: int | None = None) -> dict[str, Any]:
    """``report_seq``: the target's agent spooled every KV event it had before this ack in its
    report ``report_seq`` (or earlier), so only later reports can show what the copy stored."""
    msg: dict[str, Any] = {"type": MSG_JOB_ACK, "job_id": job_id}
    if report_seq is not None:
        msg["report_seq"] = report_seq
    return msg


def job_progress(job_id: str, bytes_done: int) -> dict[str, Any]:
    return {"type": MSG_JOB_PROGRESS, "job_id": job_id, "bytes_done": bytes_done}


def job_result(
    job_id: str,
    ok: bool,
    checksum: str | None,
    nbytes: int,
    error: str | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``extra``: what an executor adds (e.g. a warm-up's cached tokens); the fields above win."""
    return {
        **(extra or {}),
        "type": MSG_JOB_RESULT,
        "job_id": job_id,
        "state": JOB_SUCCEEDED if ok else JOB_FAILED,
        "checksum": checksum,
        "bytes": nbytes,
        "error": error,
    }


def job_cancel(job_id: str) -> dict[str, Any]:
    return {"type": MSG_JOB_CANCEL, "job_id": job_id}


# -- errors ----------------------------------------------------------------------------------
class ProtocolError(ValueError):
    """A message that breaks the protocol; ``field`` says where (e.g. ``residency[0].stored[3][0]``)."""

    def __init__(self, field: str | None, detail: str):
        super().__init__(f"{field}: {detail}" if field else detail)
        self.field = field
        self.detail = detail


# -- keys ------------------------------------------------------------------------------------
def key_hex(key: int) -> str:
    """A key in its JSON form: 16 lower-case hex digits."""
    return f"{key:016x}"


def decode_key(value: Any, where: str) -> int:
    """A key from either form (integer, or 1-16 hex digits); ProtocolError otherwise."""
    if type(value) is int:
        if 0 <= value <= KEY_MAX:
            return value
    elif isinstance(value, str) and 1 <= len(value) <= 16:
        try:
            return int(value, 16)
        except ValueError:
            pass
    raise ProtocolError(where, "expected a 64-bit key: an unsigned integer or 16 hex digits")


# -- the one encoder -------------------------------------------------------------------------
def encode_stored(rows: Iterable[StoredRow], hex_keys: bool) -> list[list[Any]]:
    """Stored rows for a report: integer keys for msgpack, ``hex_keys`` for JSON."""
    if hex_keys:
        return [[f"{k:016x}", None if p is None else f"{p:016x}", m, f] for k, p, m, f in rows]
    return [[k, p, m, f] for k, p, m, f in rows]


def encode_removed(rows: Iterable[RemovedRow], hex_keys: bool) -> list[list[Any]]:
    if hex_keys:
        return [[f"{k:016x}", m] for k, m in rows]
    return [[k, m] for k, m in rows]


def residency_entry(
    engine_id: str, mode: str, stored: list[list[Any]], removed: list[list[Any]], cleared: bool
) -> dict[str, Any]:
    """One engine's ``residency`` entry of a report (rows from ``encode_stored`` / ``_removed``)."""
    return {
        "engine_id": engine_id,
        "mode": mode,
        "stored": stored,
        "removed": removed,
        "cleared": cleared,
    }


# -- the one decoder -------------------------------------------------------------------------
def decode_stored(raw: list, where: str) -> tuple[list[tuple[int, int | None, str]], int]:
    """Validate stored rows; returns ``([(key, parent, medium)], engine-scoped count)``."""
    out: list[tuple[int, int | None, str]] = []
    append = out.append
    rank = TIER_RANK
    scoped = 0
    for i, row in enumerate(raw):
        # Fast path for the compact rows agents send (msgpack, integer keys); anything else takes
        # the checked path, which also accepts hex keys and names the first bad field.
        if type(row) is list and len(row) == 4:
            key, parent, medium, flags = row
            if (
                type(key) is int
                and 0 <= key <= KEY_MAX
                and type(medium) is str
                and medium in rank
                and (parent is None or (type(parent) is int and 0 <= parent <= KEY_MAX))
                and type(flags) is int
                and 0 <= flags <= FLAGS_MAX
            ):
                append((key, parent, medium))
                scoped += flags & FLAG_ENGINE_SCOPED
                continue
        at = f"{where}[{i}]"
        if not isinstance(row, list) or not 3 <= len(row) <= 4:
            raise ProtocolError(at, "expected [key, parent_key or null, medium, flags?]")
        key = decode_key(row[0], f"{at}[0]")
        parent = None if row[1] is None else decode_key(row[1], f"{at}[1]")
        medium = decode_medium(row[2], f"{at}[2]")
        if len(row) == 4:
            flags = row[3]
            if type(flags) is not int or not 0 <= flags <= FLAGS_MAX:
                raise ProtocolError(f"{at}[3]", f"expected an integer in [0, {FLAGS_MAX}]")
            scoped += flags & FLAG_ENGINE_SCOPED
        append((key, parent, medium))
    return out, scoped


def decode_removed(raw: list, where: str) -> list[tuple[int, str]]:
    """Validate removed rows; returns ``[(key, medium)]``."""
    out: list[tuple[int, str]] = []
    append = out.append
    rank = TIER_RANK
    for i, row in enumerate(raw):
        if type(row) is list and len(row) == 2:
            key, medium = row
            if type(key) is int and 0 <= key <= KEY_MAX and type(medium) is str and medium in rank:
                append((key, medium))
                continue
        at = f"{where}[{i}]"
        if not isinstance(row, list) or len(row) != 2:
            raise ProtocolError(at, "expected [key, medium]")
        append((decode_key(row[0], f"{at}[0]"), decode_medium(row[1], f"{at}[1]")))
    return out


def decode_medium(value: Any, where: str) -> str:
    if type(value) is not str or value not in TIER_RANK:
        raise ProtocolError(
            where, f"unknown medium {value!r}; expected {', '.join(TIERS[:-1])} or {TIERS[-1]}"
        )
    return value
