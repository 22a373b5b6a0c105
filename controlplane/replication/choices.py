"""Named constants for policies, overrides, plans, jobs and replicas."""


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
    GPU = "GPU"
    CPU = "CPU"
    DISK = "DISK"
    CHOICES = [(GPU, "GPU HBM"), (CPU, "CPU DRAM"), (DISK, "SSD")]


class Transport:
    TCP = "tcp"
    NCCL = "nccl"
    LMCACHE = "lmcache"
    CHOICES = [(TCP, "TCP"), (NCCL, "NCCL"), (LMCACHE, "LMCache move")]


class JobAction:
    REPLICATE = "replicate"
    EVICT = "evict"
    CHOICES = [(REPLICATE, "Replicate"), (EVICT, "Evict")]


class JobState:
    PENDING = "pending"
    APPROVED = "approved"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    CHOICES = [(s, s.capitalize()) for s in (PENDING, APPROVED, DISPATCHED, RUNNING, SUCCEEDED, FAILED, CANCELLED, EXPIRED)]
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
