"""Named constants for policies, overrides, plans, jobs and replicas.

What travels to agents (tiers, transports, job actions and states) takes its spelling from
``wire.protocol``.
"""

from controlplane.choiceset import ChoiceSet
from controlplane.core.policy import strategy
from wire import protocol


class PolicyMode(ChoiceSet):
    SHADOW = "shadow", "Shadow: plan and score, move nothing"
    MANUAL = "manual", "Manual: an operator approves each plan"
    AUTO = "auto", "Auto: approved within budgets"


class PolicyStrategy(ChoiceSet):
    """What decides copies (``controlplane.core.policy.strategy``, shared with the simulator)."""

    PREDICTIVE = (
        strategy.STRATEGY_PREDICTIVE,
        "Predictive: forecasts and burst onsets, with the reactive fallback",
    )
    REACTIVE = (
        strategy.STRATEGY_REACTIVE,
        "Reactive: copy once measured demand outruns the holders",
    )
    OFF = strategy.STRATEGY_OFF, "Off: no replication"


class OverrideKind(ChoiceSet):
    PIN = "pin", "Pin a prefix on an engine"
    EXCLUDE_NODE = "exclude_node", "Exclude a node from plans"
    EXCLUDE_ENGINE = "exclude_engine", "Exclude an engine from plans"
    FREEZE = "freeze", "Freeze: no new replication at all"


class PlanState(ChoiceSet):
    PROPOSED = "proposed", "Proposed"
    APPROVED = "approved", "Approved"  # not-vocabulary: a plan's state, not a job's
    PARTIAL = "partially_approved", "Partially approved"
    REJECTED = "rejected", "Rejected"
    SUPERSEDED = "superseded", "Superseded"
    SHADOW = "shadow", "Shadow (never executed)"
    OPEN = frozenset({PROPOSED, PARTIAL})  # still to be decided (or decided in part)


class ItemDecision(ChoiceSet):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"  # not-vocabulary: an item's decision, not a job's state
    REJECTED = "rejected", "Rejected"
    # Approved, then withheld at random: the holdout's control arm.
    HELD_OUT = "held_out", "Held out (randomized control)"


class StorageTier(ChoiceSet):
    """Where a block or replica lives (the wire's tier names); not the simulator's engine tier."""

    GPU = protocol.TIER_GPU, "GPU HBM"
    CPU = protocol.TIER_CPU, "CPU DRAM"
    DISK = protocol.TIER_DISK, "SSD"


class Transport(ChoiceSet):
    """Executors. ``tcp`` and ``nccl`` move bytes between agents' own block stores (the virtual
    cluster and the benchmarks); ``warmup``, ``lmcache`` and ``lmcache-mp`` act on real engines."""

    TCP = protocol.TRANSPORT_TCP, "TCP (agent stores)"
    NCCL = protocol.TRANSPORT_NCCL, "NCCL (agent stores)"
    LMCACHE = protocol.TRANSPORT_LMCACHE, "LMCache controller copy"
    LMCACHE_MP = protocol.TRANSPORT_LMCACHE_MP, "LMCache coordinator prefetch"
    WARMUP = protocol.TRANSPORT_WARMUP, "Prefill warm-up request"
    # Executors that need the prefix's token ids (LMCache and vLLM address KV by tokens).
    NEEDS_TOKENS = frozenset({LMCACHE, LMCACHE_MP, WARMUP})
    # Where a copy lands: LMCache places it in the target's CPU tier (LocalCPUBackend).
    LANDS_IN = {LMCACHE: protocol.TIER_CPU, LMCACHE_MP: protocol.TIER_CPU}


class Confirmation(ChoiceSet):
    """What showed a landed copy on its target engine (the wire's confirmation sources)."""

    KV_EVENTS = protocol.CONFIRM_KV_EVENTS, "the engine's KV events"
    LMCACHE_PIN = protocol.CONFIRM_LMCACHE_PIN, "LMCache pin on the target"
    LMCACHE_DIRECTORY = protocol.CONFIRM_LMCACHE_DIRECTORY, "LMCache coordinator directory"


class JobAction(ChoiceSet):
    REPLICATE = protocol.ACTION_REPLICATE, "Replicate"
    EVICT = protocol.ACTION_EVICT, "Evict"


class JobState(ChoiceSet):
    """A replicate job ends ``landed`` when its executor says the copy is done, then
    ``confirmed`` only when the target engine shows blocks it did not hold at dispatch, stored
    after the job started (KV events, LMCache pin or directory); ``partial`` when that covers
    only part of the prefix; ``redundant`` when the target already held it (at dispatch, or
    shows it without evidence the copy put it there); ``unconfirmed`` when it shows nothing new
    within PREWARM_REPLICA_CONFIRM_SECONDS, and ``lost`` when a confirmed copy leaves the
    engine before its hold ends. An evict job ends ``succeeded``."""

    PENDING = protocol.JOB_PENDING
    APPROVED = protocol.JOB_APPROVED
    DISPATCHED = protocol.JOB_DISPATCHED
    RUNNING = protocol.JOB_RUNNING
    LANDED = protocol.JOB_LANDED
    CONFIRMED = protocol.JOB_CONFIRMED
    UNCONFIRMED = protocol.JOB_UNCONFIRMED
    LOST = protocol.JOB_LOST
    SUCCEEDED = protocol.JOB_SUCCEEDED
    FAILED = protocol.JOB_FAILED
    CANCELLED = protocol.JOB_CANCELLED
    EXPIRED = protocol.JOB_EXPIRED
    REDUNDANT = protocol.JOB_REDUNDANT
    PARTIAL = protocol.JOB_PARTIAL
    CHOICES = [(s, s.capitalize()) for s in protocol.JOB_STATES]
    # Approved and moving, not landed yet (the wire's one definition of each group).
    IN_FLIGHT = frozenset(protocol.JOB_IN_FLIGHT)
    # Not final and not landed yet: pending counts (the budgets and the planner agree on it).
    LIVE = frozenset(protocol.JOB_LIVE)
    # No agent delivery left to do: late job events change nothing.
    TERMINAL = frozenset(
        {
            LANDED,
            CONFIRMED,
            UNCONFIRMED,
            LOST,
            SUCCEEDED,
            FAILED,
            CANCELLED,
            EXPIRED,
            REDUNDANT,
            PARTIAL,
        }
    )
    # The executor did its part (a copy landed, or an eviction ran).
    DONE = frozenset({LANDED, CONFIRMED, UNCONFIRMED, LOST, SUCCEEDED, REDUNDANT, PARTIAL})
    # A copy on its way or landed and awaiting the engine: with the replicas whose hold has not
    # ended, its (prefix, engine) is held-to-be for the planner and the approval check.
    UNSETTLED = frozenset({*LIVE, LANDED})
    # The one table of legal transitions; failed -> approved is a bounded retry. ``unconfirmed``
    # is final: the engine's own traffic storing the prefix later proves nothing about the copy.
    # A copy whose target held the whole prefix at dispatch goes approved -> redundant.
    ALLOWED = {
        PENDING: {APPROVED, CANCELLED, EXPIRED},
        APPROVED: {DISPATCHED, CANCELLED, EXPIRED, REDUNDANT},
        DISPATCHED: {RUNNING, FAILED, CANCELLED, EXPIRED},
        RUNNING: {LANDED, SUCCEEDED, FAILED, CANCELLED, EXPIRED},
        LANDED: {CONFIRMED, UNCONFIRMED, REDUNDANT, PARTIAL},
        CONFIRMED: {LOST},
        PARTIAL: {LOST},
        UNCONFIRMED: set(),
        REDUNDANT: set(),
        LOST: set(),
        FAILED: {APPROVED},
        SUCCEEDED: set(),
        CANCELLED: set(),
        EXPIRED: set(),
    }
