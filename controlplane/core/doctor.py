"""The fleet doctor's checks (no Django): what makes KV-aware routing, and Prewarm's own
accounting, silently wrong, each finding naming the setting to change.

Inputs are what agents already report per engine (``Engine.doctor``, filled by the agent from the
engine's KV events, its ``/metrics`` ``vllm:cache_config_info`` gauge and its request tap) and the
control plane's own records; ``controlplane/readmodels/doctor.py`` gathers them. The checks and
what operators met that each one answers (docs/deploy.md, "Troubleshooting KV-aware routing"):

- ``block_size_mismatch``: engines of one model with different block sizes. Their block hashes
  cover different token runs, so a router's index never matches one engine's blocks to another's
  (Dynamo warns "KV Router block size mismatch ... will cause routing to fail silently").
- ``block_size_wrong``: the agent's ``block_size`` is not the engine's ``--block-size``: Prewarm's
  canonical keys, and every prediction made from them, are then wrong for that engine.
- ``hash_algo_mismatch``: ``--prefix-caching-hash-algo`` differs across engines of one model.
- ``hash_seed_mismatch``: engines of one model publish different hashes for the same first block
  of a prompt: their ``NONE_HASH`` differs (``PYTHONHASHSEED`` unset or unequal with a
  non-cryptographic hash, the first of production-stack's silent-miss preconditions).
- ``prefix_caching_off``: the engine runs without ``--enable-prefix-caching``: it can hit nothing.
- ``topic_dropped``: the engine publishes its KV events under a topic the router does not take
  (vllm-router takes the empty topic only and drops the rest without a word).
- ``events_none`` / ``events_stopped``: the engine served prompts that must have stored new
  blocks, and its events never arrived, or stopped arriving.
- ``replay_unanswered``: the engine's replay socket did not answer, so lost events cannot be
  recovered (every gap is a resync).
- ``short_prompts``: a large share of prompts shorter than one block: nothing of them can be
  cached (vllm#54607: a 0% hit rate that is correct).
- ``predicted_not_delivered``: requests the engine's own events said would hit were served with
  no cached token (llm-d-router#2896: predicted against delivered, per engine).
- ``transport_missing``: the policy places copies with a transport a node's agent does not run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

BLOCK_SIZE_MISMATCH = "block_size_mismatch"
BLOCK_SIZE_WRONG = "block_size_wrong"
HASH_ALGO_MISMATCH = "hash_algo_mismatch"
HASH_SEED_MISMATCH = "hash_seed_mismatch"
PREFIX_CACHING_OFF = "prefix_caching_off"
TOPIC_DROPPED = "topic_dropped"
EVENTS_NONE = "events_none"
EVENTS_STOPPED = "events_stopped"
REPLAY_UNANSWERED = "replay_unanswered"
SHORT_PROMPTS = "short_prompts"
PREDICTED_NOT_DELIVERED = "predicted_not_delivered"
TRANSPORT_MISSING = "transport_missing"
CHECKS = (
    BLOCK_SIZE_MISMATCH,
    BLOCK_SIZE_WRONG,
    HASH_ALGO_MISMATCH,
    HASH_SEED_MISMATCH,
    PREFIX_CACHING_OFF,
    TOPIC_DROPPED,
    EVENTS_NONE,
    EVENTS_STOPPED,
    REPLAY_UNANSWERED,
    SHORT_PROMPTS,
    PREDICTED_NOT_DELIVERED,
    TRANSPORT_MISSING,
)
ANY_TOPIC = "*"  # the router takes every topic: no topic check


@dataclass(frozen=True)
class Limits:
    """The doctor's thresholds (settings ``PREWARM_DOCTOR_*``)."""

    router_topic: str = ""  # vllm-router's; ANY_TOPIC for routers that take any
    events_silent_s: float = 30.0  # new blocks served this long after the last event
    min_requests: int = 3  # fewer requests in the tap's window say nothing
    short_share: float = 0.2  # of requests shorter than one block
    cold_share: float = 0.3  # of predicted hits served with no cached token


@dataclass(frozen=True)
class EngineView:
    """One engine as the doctor sees it."""

    name: str  # node/engine_id
    model: str
    block_size: int  # the agent's configured block size
    doctor: dict[str, Any] = field(default_factory=dict)  # Engine.doctor, from its agent
    node_transports: tuple[str, ...] | None = None  # None: the agent does not say


@dataclass(frozen=True)
class Finding:
    check: str
    subject: str  # an engine (node/engine_id), a model or a node
    detail: str  # what was seen
    setting: str  # what to change

    def as_dict(self) -> dict[str, str]:
        return {
            "check": self.check,
            "subject": self.subject,
            "detail": self.detail,
            "setting": self.setting,
        }


def engine_block_size(e: EngineView) -> int:
    """The engine's own block size where it said (its cache config or its events)."""
    cfg = e.doctor.get("cache_config") or {}
    try:
        return int(cfg.get("block_size") or e.doctor.get("event_block_size") or 0)
    except (TypeError, ValueError):
        return 0


def _differ(
    check: str, model: str, values: dict[str, Any], what: str, setting: str
) -> list[Finding]:
    if len(set(values.values())) < 2:
        return []
    seen = ", ".join(f"{n}: {v}" for n, v in sorted(values.items()))
    return [Finding(check, model, f"engines of {model!r} differ in {what} ({seen})", setting)]


def _per_model(engines: list[EngineView]) -> list[Finding]:
    out: list[Finding] = []
    by_model: dict[str, list[EngineView]] = defaultdict(list)
    for e in engines:
        by_model[e.model].append(e)
    for model, group in sorted(by_model.items()):
        if len(group) < 2:
            continue
        sizes = {e.name: engine_block_size(e) or e.block_size for e in group}
        out += _differ(
            BLOCK_SIZE_MISMATCH,
            model,
            sizes,
            "block size",
            "give every engine of the model the same --block-size (and its agent the same "
            "block_size)",
        )
        algos = {
            e.name: (e.doctor.get("cache_config") or {}).get("prefix_caching_hash_algo")
            for e in group
        }
        out += _differ(
            HASH_ALGO_MISMATCH,
            model,
            {n: a for n, a in algos.items() if a},
            "prefix-caching hash algorithm",
            "give every engine of the model the same --prefix-caching-hash-algo",
        )
        # The same first block hashed differently by two engines: their NONE_HASH differs.
        hashes: dict[str, dict[str, str]] = defaultdict(dict)  # root key -> engine -> hash
        for e in group:
            for key, h in (e.doctor.get("roots") or {}).items():
                hashes[key][e.name] = h
        split = next((per for _, per in sorted(hashes.items()) if len(set(per.values())) > 1), None)
        if split:
            sides: dict[str, list[str]] = defaultdict(list)
            for name, h in sorted(split.items()):
                sides[h].append(name)
            seen = "; ".join(f"{', '.join(names)} hash it {h}" for h, names in sides.items())
            out.append(
                Finding(
                    HASH_SEED_MISMATCH,
                    model,
                    f"engines of {model!r} publish different block hashes for the same first "
                    f"block of a prompt ({seen}): a router matching engine hashes sees no shared "
                    "prefix",
                    "set the same PYTHONHASHSEED on every engine of the model (with "
                    "--prefix-caching-hash-algo xxhash it is random per process unless set), "
                    "and the same --prefix-caching-hash-algo",
                )
            )
    return out


def _per_engine(e: EngineView, now: float, limits: Limits) -> list[Finding]:
    return [*_engine_config(e, limits), *_engine_events(e, limits), *_engine_tap(e, limits)]


def _engine_config(e: EngineView, limits: Limits) -> list[Finding]:
    """The engine's configuration against its agent's and the router's."""
    out: list[Finding] = []
    cfg = e.doctor.get("cache_config") or {}
    own = engine_block_size(e)
    if own and own != e.block_size:
        out.append(
            Finding(
                BLOCK_SIZE_WRONG,
                e.name,
                f"the agent keys this engine with block_size {e.block_size}, the engine runs "
                f"--block-size {own}",
                f"set block_size = {own} for engine {e.name.rpartition('/')[2]} in the agent's "
                "configuration",
            )
        )
    if str(cfg.get("enable_prefix_caching", "")).lower() == "false":
        out.append(
            Finding(
                PREFIX_CACHING_OFF,
                e.name,
                "the engine runs without prefix caching: no request can hit",
                "start vLLM with --enable-prefix-caching",
            )
        )
    topic = e.doctor.get("topic")
    if topic is not None and limits.router_topic != ANY_TOPIC and topic != limits.router_topic:
        out.append(
            Finding(
                TOPIC_DROPPED,
                e.name,
                f"the engine publishes KV events under topic {topic!r}; the router takes "
                f"{limits.router_topic!r} only and drops the rest",
                f'set "topic": "{limits.router_topic}" in vLLM\'s --kv-events-config (and '
                "the agent's topic to match), or PREWARM_DOCTOR_ROUTER_TOPIC to the router's",
            )
        )
    return out


def _engine_events(e: EngineView, limits: Limits) -> list[Finding]:
    """Whether the engine's KV events reach its agent, and its replay socket answers."""
    out: list[Finding] = []
    d = e.doctor
    last_event = d.get("last_event_at") or 0.0
    stored_at = (d.get("tap") or {}).get("last_stored_at") or 0.0
    if stored_at and stored_at > last_event + limits.events_silent_s:
        never = not last_event
        subscribed = d.get("subscribed_topic") or ""
        out.append(
            Finding(
                EVENTS_NONE if never else EVENTS_STOPPED,
                e.name,
                (
                    "the engine served prompts that stored new blocks and no KV event ever "
                    "reached its agent"
                    if never
                    else f"no KV event for {stored_at - last_event:.0f} s while the engine "
                    "stored new blocks"
                ),
                "check vLLM's --kv-events-config (enable_kv_cache_events, publisher zmq, "
                "endpoint) against the agent's kv_events and kv_events_socket (which side "
                "binds)" + (f", and the agent's topic {subscribed!r}" if subscribed else ""),
            )
        )
    if d.get("replay_answered") is False:
        out.append(
            Finding(
                REPLAY_UNANSWERED,
                e.name,
                "the engine's replay socket did not answer: lost events cannot be recovered",
                "set replay_endpoint in vLLM's --kv-events-config and the agent's replay to "
                "the same address",
            )
        )
    return out


def _engine_tap(e: EngineView, limits: Limits) -> list[Finding]:
    """What the agent's request tap saw: prompts too short to cache, predicted hits served
    cold."""
    tap = e.doctor.get("tap") or {}
    requests = int(tap.get("requests") or 0)
    short = int(tap.get("short_prompts") or 0)
    predicted = int(tap.get("predicted_hits") or 0)
    cold = int(tap.get("predicted_hits_served_cold") or 0)
    return [
        *_share_too_large(
            Finding(
                SHORT_PROMPTS,
                e.name,
                f"{short} of {requests} prompts were shorter than one block ({e.block_size} "
                "tokens): nothing of them can be cached",
                "a smaller --block-size on the engine (and block_size on its agent), or "
                "longer shared prefixes",
            ),
            short,
            of=requests,
            share=limits.short_share,
            counted=requests,
            limits=limits,
        ),
        *_share_too_large(
            Finding(
                PREDICTED_NOT_DELIVERED,
                e.name,
                f"{cold} of {predicted} requests the engine's KV events said would hit were "
                "served with no cached token",
                "the residency Prewarm and routers read is stale: check the event stream "
                "(gaps, resyncs) and the engine's cache_salt / LoRA use; an engine reset "
                "(POST /reset_prefix_cache) announces its clear only with its next step",
            ),
            cold,
            of=predicted,
            share=limits.cold_share,
            counted=cold,
            limits=limits,
        ),
    ]


def _share_too_large(
    finding: Finding, part: int, *, of: int, share: float, counted: int, limits: Limits
) -> list[Finding]:
    """``finding`` where ``part`` is more than ``share`` of ``of``, once ``counted`` requests
    make the share mean something (fewer than ``limits.min_requests`` say nothing)."""
    return [finding] if counted >= limits.min_requests and part > share * of else []


def examine(
    engines: list[EngineView], now: float, limits: Limits, policy_transport: str = ""
) -> list[Finding]:
    """Every finding on the fleet, per model first, then per engine and node."""
    out = _per_model(engines)
    for e in sorted(engines, key=lambda e: e.name):
        out += _per_engine(e, now, limits)
    if policy_transport:
        lacking = sorted(
            {
                e.name.partition("/")[0]
                for e in engines
                if e.node_transports is not None and policy_transport not in e.node_transports
            }
        )
        for node in lacking:
            out.append(
                Finding(
                    TRANSPORT_MISSING,
                    node,
                    f"the active policy copies with {policy_transport!r} and this node's agent "
                    "does not run it: every copy to it fails",
                    f"add {policy_transport} to the agent's transfer.transports, or change the "
                    "policy's default_transport",
                )
            )
    return out
