"""A planning cycle: the database and residency index in, ``ReplicationPlan`` rows out.

Describes the cluster to the pure planner (``controlplane.core.planner.plan``, the function the
simulator's predictive policy runs too) and stores its items. Then the policy's mode decides:
``shadow`` keeps the plan as never executed and records the replicas it would have placed (so
they are scored as if executed), ``auto`` approves it through ``services.decide`` within budgets,
``manual`` leaves it for an operator. Overrides are applied here and again at approval.
"""

from __future__ import annotations

import json
import logging
import time
from collections import namedtuple
from dataclasses import dataclass
from datetime import UTC, timedelta

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from controlplane.core import blockhash, planner
from controlplane.core.costmodel import MODELS, CostModel
from controlplane.core.demand import confidence, demand_for
from controlplane.core.protocol import TIER_CPU, TIER_DISK, TIER_GPU
from controlplane.demand.models import WorkloadKey
from controlplane.demand.services import want_prefix_tokens
from controlplane.fleet.choices import EngineLifecycle, NodeState
from controlplane.fleet.models import Engine
from controlplane.fleet.residency import get_index
from controlplane.forecasting.models import Forecast
from controlplane.realtime import groups
from controlplane.realtime.publish import publish

from .choices import JobAction, JobState, OverrideKind, PlanState, PolicyMode, Transport
from .models import PlanItem, Policy, ReplicationJob, ReplicationPlan, SpeculativeReplica
from .services import OPEN_PLAN_STATES, active_overrides, decide

log = logging.getLogger(__name__)
# Promotion bandwidth from CPU DRAM (PCIe 5 x16, ~50 GB/s usable) and SSD (NVMe, ~6 GB/s).
TIER_BYTES_PER_S = {TIER_CPU: 50e9, TIER_DISK: 6e9}


def cost_model_for(model_name: str) -> CostModel:
    """The cost-model preset whose name the engine's model mentions, else the configured one."""
    low = model_name.lower()
    name = next(
        (n for n in sorted(MODELS, key=len, reverse=True) if n.split("-")[-1] in low),
        settings.PREWARM_DEFAULT_MODEL,
    )
    return CostModel.preset(name, settings.PREWARM_DEFAULT_GPU)


@dataclass
class Inputs:
    candidates: list[planner.Candidate]
    demand: list[planner.Demand]
    holdings: list[planner.Holding]
    engines: list[planner.EngineState]
    overrides: planner.Overrides
    keys: dict[str, KeyRow]
    forecasters: dict[str, str]


# Plain rows instead of model instances: a cycle reads 100k keys and forecasts, and building
# model objects was most of its time. JSON columns are read as text and decoded in one
# ``json.loads`` per query (Django's per-row JSON and datetime converters were the rest).
KeyRow = namedtuple("KeyRow", "pk tenant model chain prefix_tokens")
ForecastRow = namedtuple(
    "ForecastRow", "key_id yhat bucket_seconds model burst_risk backtest_mase start"
)


def _decode_json_texts(texts: list[str]) -> list:
    """Many JSON documents (as the database returned them) decoded in a single call."""
    return json.loads("[" + ",".join(texts) + "]") if texts else []


def _workload_keys() -> dict[str, KeyRow]:
    rows = list(
        WorkloadKey.objects.exclude(prefix_keys=[])
        .annotate(raw=Cast("prefix_keys", TextField()))
        .values_list("pk", "tenant", "model", "raw", "prefix_tokens")
        .iterator(chunk_size=5000)
    )
    chains = _decode_json_texts([r[3] for r in rows])
    from_hex = blockhash.from_hex
    return {
        str(r[0]): KeyRow(r[0], r[1], r[2], tuple(map(from_hex, chain)), r[4])
        for r, chain in zip(rows, chains, strict=True)
    }


def _latest_forecasts() -> dict[int, ForecastRow]:
    """The newest forecast per key in one query (DISTINCT ON where the database has it)."""
    rows = Forecast.objects.order_by("key_id", "-generated_at", "-id")
    if connection.features.can_distinct_on_fields:
        rows = rows.distinct("key_id")
    rows = rows.annotate(raw_yhat=Cast("yhat", TextField()), raw_start=Cast("start", TextField()))
    latest: dict[int, tuple] = {}
    for r in rows.values_list(
        "key_id", "raw_yhat", "bucket_seconds", "model", "burst_risk", "backtest_mase", "raw_start"
    ).iterator(chunk_size=5000):
        if r[0] not in latest:
            latest[r[0]] = r
    yhats = _decode_json_texts([r[1] for r in latest.values()])
    starts: dict[str, object] = {}  # a cycle's forecasts share a few start times: parse each once
    out = {}
    for r, yhat in zip(latest.values(), yhats, strict=True):
        start = starts.get(r[6]) or starts.setdefault(r[6], _parse_datetime(r[6]))
        out[r[0]] = ForecastRow(r[0], yhat, r[2], r[3], r[4], r[5], start)
    return out


def _parse_datetime(text: str):
    value = parse_datetime(text)
    if value is None:
        raise ValueError(f"forecast start is not a timestamp: {text!r}")
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def _engine_states(engines: list[Engine]) -> list[planner.EngineState]:
    index = get_index()
    spec = dict(
        SpeculativeReplica.objects.filter(evicted_at__isnull=True, shadow=False)
        .values_list("engine_id")
        .annotate(b=Sum("bytes"))
    )
    coming = dict(
        ReplicationJob.objects.filter(
            state__in=[JobState.APPROVED, JobState.DISPATCHED, JobState.RUNNING],
            action=JobAction.REPLICATE,
        )
        .values_list("target_id")
        .annotate(b=Sum("bytes"))
    )
    out = []
    for e in engines:
        cap = e.kv_capacity_bytes
        metrics = e.metrics or {}
        load = metrics.get("kv_usage")
        if isinstance(load, int | float):
            # vLLM's KV usage counts blocks held by running requests; the rest of a full prefix
            # cache is evictable, so a replica can take it (the engine evicts LRU to make room).
            used = min(1.0, max(0.0, float(load))) * cap
        else:
            used = index.usage(e.pk).blocks.get("GPU", 0) * e.bytes_per_block
        load = (
            float(load) if isinstance(load, int | float) else settings.PREWARM_DEFAULT_ENGINE_LOAD
        )
        out.append(
            planner.EngineState(
                engine_id=str(e.pk),
                node=str(e.node_id),
                kv_capacity_bytes=float(cap),
                free_bytes=float(max(0, cap - used)),
                spec_bytes=float(spec.get(e.pk, 0) + coming.get(e.pk, 0)),
                link_bytes_per_s=settings.PREWARM_LINK_BYTES_PER_S,
                load=min(1.0, max(0.0, load)),
                lifecycle=e.lifecycle,
                starts_serving_in_s=settings.PREWARM_WARMING_LEAD_SECONDS
                if e.lifecycle == EngineLifecycle.WARMING
                else 0.0,
                tier_bytes_per_s=TIER_BYTES_PER_S,
            )
        )
    return out


def gather(policy: Policy, now=None) -> Inputs:
    """Everything the planner needs, read once."""
    now = now or timezone.now()
    engines = list(Engine.objects.select_related("node").filter(node__state=NodeState.ACTIVE))
    by_model: dict[str, list[Engine]] = {}
    for e in engines:
        by_model.setdefault(e.model, []).append(e)
    keys = _workload_keys()
    forecasts = _latest_forecasts()
    horizon = float(policy.horizon_seconds)
    rows = [
        (pid, key, forecasts[key.pk])
        for pid, key in keys.items()
        if by_model.get(key.model) and key.pk in forecasts
    ]
    expected = expected_many([f for _, _, f in rows], now, horizon)
    cands, demand, forecasters = [], [], {}
    models = {m: cost_model_for(m) for m in {key.model for _, key, _ in rows}}
    # Service and recompute times depend only on (model, prefix tokens): a few distinct values.
    times: dict[tuple[str, int], tuple[float, float]] = {}
    for (pid, key, f), exp in zip(rows, expected.tolist(), strict=True):
        peers, cm, chain = by_model[key.model], models[key.model], key.chain
        tokens = key.prefix_tokens or len(chain) * peers[0].block_size
        t = times.get((key.model, tokens))
        if t is None:  # a typical 256-token suffix after the prefix
            t = times[(key.model, tokens)] = (
                cm.prefill_seconds(256, tokens),
                cm.prefill_seconds(tokens) - cm.batch_overhead_s,
            )
        bpb = peers[0].bytes_per_block or int(cm.kv_bytes_per_token * peers[0].block_size)
        cands.append(
            planner.Candidate(pid, chain, tokens, bpb * len(chain), key.tenant, t[0], t[1])
        )
        # The demand model the simulator's predictive policy shares (core.demand).
        demand.append(
            demand_for(
                pid,
                expected_requests=exp,
                horizon_s=horizon,
                burst_probability=f.burst_risk or 0.0,
                backtest_mase=f.backtest_mase,
            )
        )
        forecasters[pid] = f.model
    # One batched residency read for every prefix (100k holders() calls were 100k round trips);
    # the planner copies only from engines holding the whole chain.
    index = get_index()
    holdings = [
        planner.Holding(c.prefix_id, str(h.engine), h.tier)
        for c, found in zip(
            cands, index.full_holders_many([c.keys for c in cands], limit=64), strict=True
        )
        for h in found
    ]
    return Inputs(cands, demand, holdings, _engine_states(engines), _overrides(), keys, forecasters)


def _expected(f: ForecastRow, now, horizon: float) -> float:
    """Requests the forecast expects in [now, now + horizon) (buckets overlapping it, pro rata)."""
    t0 = f.start.timestamp()
    a, b = now.timestamp(), now.timestamp() + horizon
    total = 0.0
    for i, y in enumerate(f.yhat):
        lo, hi = t0 + i * f.bucket_seconds, t0 + (i + 1) * f.bucket_seconds
        overlap = max(0.0, min(hi, b) - max(lo, a))
        total += max(0.0, float(y)) * overlap / f.bucket_seconds
    if total == 0.0 and f.yhat and a >= t0 + len(f.yhat) * f.bucket_seconds:
        total = (
            max(0.0, float(f.yhat[-1])) * horizon / f.bucket_seconds
        )  # past its horizon: last level
    return total


def expected_many(rows: list[ForecastRow], now, horizon: float) -> np.ndarray:
    """``_expected`` of many forecasts: the forecasts of one cycle share start, bucket and
    length, so each such group is one matrix-vector product of its yhat rows with the overlap
    weights of its buckets."""
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(rows):
        groups.setdefault((f.start, f.bucket_seconds, len(f.yhat)), []).append(i)
    out = np.zeros(len(rows))
    a = now.timestamp()
    for (start, bucket, n), idx in groups.items():
        if n == 0:
            continue
        t0 = start.timestamp()
        lo = t0 + bucket * np.arange(n, dtype=float)
        overlap = np.clip(np.minimum(lo + bucket, a + horizon) - np.maximum(lo, a), 0.0, None)
        y = np.clip(np.array([rows[i].yhat for i in idx], dtype=float), 0.0, None)
        total = y @ (overlap / bucket)
        if a >= t0 + n * bucket:  # past its horizon: the last level
            total = np.where(total == 0.0, y[:, -1] * horizon / bucket, total)
        out[idx] = total
    return out


def _confidence(f: ForecastRow) -> float:
    """``core.demand.confidence`` of the forecast's backtest (1 / (1 + MASE); 0.5 unscored)."""
    return confidence(f.backtest_mase)


def _overrides() -> planner.Overrides:
    ov = list(active_overrides())
    return planner.Overrides(
        excluded_engines=frozenset(
            str(o.engine_id) for o in ov if o.kind == OverrideKind.EXCLUDE_ENGINE
        ),
        excluded_nodes=frozenset(str(o.node_id) for o in ov if o.kind == OverrideKind.EXCLUDE_NODE),
        frozen=any(o.kind == OverrideKind.FREEZE for o in ov),
    )


def _pin_items(inputs: Inputs) -> list[planner.PlannedMove]:
    """Pins: copy the pinned chain to the pinned engine from a holder, whatever the forecast."""
    if inputs.overrides.frozen:
        return []
    index, out = get_index(), []
    for o in active_overrides().filter(kind=OverrideKind.PIN).select_related("engine"):
        chain = tuple(blockhash.from_hex(h) for h in o.prefix_keys)
        holders = {h.engine: h for h in index.holders(chain, limit=64) if h.depth == len(chain)}
        if (
            o.engine_id in holders
            or not holders
            or str(o.engine_id) in inputs.overrides.excluded_engines
        ):
            continue
        src = next(iter(holders))
        nbytes = len(chain) * (o.engine.bytes_per_block or 0)
        out.append(
            planner.PlannedMove(
                f"pin:{o.pk}",
                chain,
                str(src),
                str(o.engine_id),
                TIER_GPU,
                nbytes,
                0.0,
                0.0,
                0.0,
                1.0,
                f"pinned by override #{o.pk}: {o.reason or 'no reason given'}",
            )
        )
    return out


def update_readiness(inputs: Inputs, planned: list[planner.PlannedMove]) -> dict[int, float]:
    """Readiness of each warming engine: the share of the bytes of the forecast-hot prefixes it
    is planned to hold that are already resident there. 1.0 when none are planned for it."""
    wanted: dict[str, set[str]] = {}
    for it in planned:
        wanted.setdefault(it.target, set()).add(it.prefix_id)
    held = {(h.prefix_id, h.engine_id) for h in inputs.holdings if h.tier == TIER_GPU}
    for it in SpeculativeReplica.objects.filter(evicted_at__isnull=True, shadow=False).values_list(
        "workload_key_id", "engine_id"
    ):
        wanted.setdefault(str(it[1]), set()).add(str(it[0]))
    sizes = {c.prefix_id: c.nbytes for c in inputs.candidates}
    out = {}
    for e in inputs.engines:
        if e.lifecycle != EngineLifecycle.WARMING:
            continue
        need = wanted.get(e.engine_id, set())
        total = sum(sizes.get(p, 0) for p in need)
        have = sum(sizes.get(p, 0) for p in need if (p, e.engine_id) in held)
        out[int(e.engine_id)] = round(have / total, 4) if total else 1.0
    for pk, r in out.items():
        Engine.objects.filter(pk=pk).update(readiness=r)
    if out:
        publish(
            groups.CLUSTER, "engine.readiness", {"readiness": {str(k): v for k, v in out.items()}}
        )
    return out


def run_cycle(policy_id: int | None = None, now=None) -> ReplicationPlan | None:
    """Plan, store, then apply the policy's mode. Returns the stored plan (None: no policy)."""
    policy = (
        Policy.objects.filter(pk=policy_id).first()
        if policy_id
        else Policy.objects.filter(active=True).first()
    )
    if policy is None:
        log.info("plan: no active policy")
        return None
    now = now or timezone.now()
    t0 = time.perf_counter()
    inputs = gather(policy, now)
    budgets = planner.Budgets(
        max_spec_vram_fraction=policy.max_spec_vram_fraction,
        max_bytes_per_interval=policy.max_bytes_per_interval,
        min_confidence=policy.min_confidence,
        ttl_s=policy.replica_ttl_seconds,
        horizon_s=policy.horizon_seconds,
    )
    items = planner.plan(
        inputs.candidates, inputs.demand, inputs.holdings, inputs.engines, budgets, inputs.overrides
    )
    items = _pin_items(inputs) + items
    planned_s = time.perf_counter() - t0
    plan = store(policy, inputs, items, planned_s)
    update_readiness(inputs, items)
    if policy.mode == PolicyMode.SHADOW:
        _shadow_replicas(plan, policy, now)
    elif policy.mode == PolicyMode.AUTO and items:
        decide(plan.pk, None, True, reason="auto mode: approved within budgets")
    return plan


@transaction.atomic
def store(
    policy: Policy, inputs: Inputs, items: list[planner.PlannedMove], planned_s: float
) -> ReplicationPlan:
    # A new proposal supersedes the open ones: approving a stale plan would act on old residency.
    ReplicationPlan.objects.filter(state=PlanState.PROPOSED).update(state=PlanState.SUPERSEDED)
    plan = ReplicationPlan.objects.create(
        policy=policy,
        mode=policy.mode,
        state=PlanState.SHADOW if policy.mode == PolicyMode.SHADOW else PlanState.PROPOSED,
        summary={
            "candidates": len(inputs.candidates),
            "engines": len(inputs.engines),
            "items": len(items),
            "bytes": sum(i.nbytes for i in items),
            "expected_ttft_saved_s": round(sum(i.expected_ttft_saved_s for i in items), 3),
            "planner_seconds": round(planned_s, 4),
            "frozen": inputs.overrides.frozen,
            # the forecaster behind each planned key (scoring credits it), not all 100k
            "forecasters": {
                it.prefix_id: inputs.forecasters[it.prefix_id]
                for it in items
                if it.prefix_id in inputs.forecasters
            },
        },
    )
    rows = []
    for it in items:
        key = inputs.keys.get(it.prefix_id)
        rows.append(
            PlanItem(
                plan=plan,
                workload_key_id=key.pk if key else None,
                prefix_keys=list(map(blockhash.to_hex, it.keys)),
                prefix_tokens=key.prefix_tokens if key else 0,
                source_id=int(it.source),
                target_id=int(it.target),
                tier=it.tier,
                bytes=it.nbytes,
                expected_ttft_saved_s=it.expected_ttft_saved_s,
                cost_s=it.cost_s,
                confidence=it.confidence,
                reason=it.reason[:2000],
            )
        )
    PlanItem.objects.bulk_create(rows, batch_size=2000)
    if policy.default_transport in Transport.NEEDS_TOKENS:
        # Its executor addresses KV by token ids: keep them for the keys this plan uses.
        want_prefix_tokens({r.workload_key_id for r in rows if r.workload_key_id})
    publish(
        groups.PLANS,
        "plan.created",
        {"plan": plan.pk, "mode": plan.mode, "state": plan.state, "items": len(rows)},
    )
    return plan


def _shadow_replicas(plan: ReplicationPlan, policy: Policy, now) -> None:
    """Shadow mode: the replicas the plan would have placed, to be scored as if executed."""
    ttl = timedelta(seconds=policy.replica_ttl_seconds)
    forecasters = plan.summary.get("forecasters", {})
    SpeculativeReplica.objects.bulk_create(
        [
            SpeculativeReplica(
                item=i,
                engine_id=i.target_id,
                workload_key_id=i.workload_key_id,
                prefix_keys=i.prefix_keys,
                tier=i.tier,
                bytes=i.bytes,
                shadow=True,
                bytes_moved=i.bytes,  # what it would have moved: it never did
                forecaster=forecasters.get(str(i.workload_key_id), ""),
                placed_at=now,
                expires_at=now + ttl,
            )
            for i in plan.items.all()
        ],
        batch_size=2000,
    )


def due(policy: Policy, now=None) -> dict[str, bool]:
    """Whether the policy's forecast and plan cadences say a new cycle is due."""
    now = now or timezone.now()
    last_f = (
        Forecast.objects.order_by("-generated_at").values_list("generated_at", flat=True).first()
    )
    last_p = (
        ReplicationPlan.objects.order_by("-created_at").values_list("created_at", flat=True).first()
    )
    return {
        "forecast": last_f is None
        or (now - last_f).total_seconds() >= policy.forecast_every_seconds,
        "plan": last_p is None or (now - last_p).total_seconds() >= policy.plan_every_seconds,
        "open_plan": ReplicationPlan.objects.filter(state__in=OPEN_PLAN_STATES).exists(),
    }
