"""Named constants for policies, overrides, plans, jobs and replicas.

What travels to agents (tiers, transports, job actions and states) takes its spelling from
``controlplane.core.protocol``.
"""

from controlplane.core import protocol as wire


class PolicyMode:
    SHADOW = "shadow"
    MANUAL = "manual"
    AUTO = "auto"
    CHOICES = [(SHADOW, "Shadow: plan and score, move nothing"), (MANUAL, "Manual: an operator approves each plan"), (AUTO, "Auto: approved within budgets")]


class OverrideKind:
    PIN = "pin"
    EXCLUDE_NODE = "exclude_node"
    EXCLUDE_ENGINE = "exclude_engine"
    FREEZE = "freeze"
    CHOICES = [(PIN, "Pin a prefix on an engine"), (EXCLUDE_NODE, "Exclude a node from plans"), (EXCLUDE_ENGINE, "Exclude an engine from plans"), (FREEZE, "Freeze: no new replication at all")]


class PlanState:
    PROPOSED = "proposed"
    APPROVED = "approved"
    PARTIAL = "partially_approved"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    SHADOW = "shadow"
    CHOICES = [(PROPOSED, "Proposed"), (APPROVED, "Approved"), (PARTIAL, "Partially approved"), (REJECTED, "Rejected"), (SUPERSEDED, "Superseded"), (SHADOW, "Shadow (never executed)")]


class ItemDecision:
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CHOICES = [(PENDING, "Pending"), (APPROVED, "Approved"), (REJECTED, "Rejected")]


class Tier:
    GPU = wire.TIER_GPU
    CPU = wire.TIER_CPU
    DISK = wire.TIER_DISK
    CHOICES = [(GPU, "GPU HBM"), (CPU, "CPU DRAM"), (DISK, "SSD")]


class Transport:
    TCP = wire.TRANSPORT_TCP
    NCCL = wire.TRANSPORT_NCCL
    LMCACHE = wire.TRANSPORT_LMCACHE
    CHOICES = [(TCP, "TCP"), (NCCL, "NCCL"), (LMCACHE, "LMCache move")]


class JobAction:
    REPLICATE = wire.ACTION_REPLICATE
    EVICT = wire.ACTION_EVICT
    CHOICES = [(REPLICATE, "Replicate"), (EVICT, "Evict")]


class JobState:
    PENDING = wire.JOB_PENDING
    APPROVED = wire.JOB_APPROVED
    DISPATCHED = wire.JOB_DISPATCHED
    RUNNING = wire.JOB_RUNNING
    SUCCEEDED = wire.JOB_SUCCEEDED
    FAILED = wire.JOB_FAILED
    CANCELLED = wire.JOB_CANCELLED
    EXPIRED = wire.JOB_EXPIRED
    CHOICES = [(s, s.capitalize()) for s in wire.JOB_STATES]
    TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, EXPIRED})
    # The one table of legal transitions; failed -> approved is a bounded retry.
    ALLOWED = {
        PENDING: {APPROVED, CANCELLED, EXPIRED},
        APPROVED: {DISPATCHED, CANCELLED, EXPIRED},
        DISPATCHED: {RUNNING, SUCCEEDED, FAILED, CANCELLED, EXPIRED},
        RUNNING: {SUCCEEDED, FAILED, CANCELLED, EXPIRED},
        FAILED: {APPROVED},
        SUCCEEDED: set(),
        CANCELLED: set(),
        EXPIRED: set(),
    }
