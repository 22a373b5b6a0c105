"""A planning cycle's inputs: the database and residency index read once and described to the
pure planner (``controlplane.core.policy.planner``) as candidates, demand, holdings and engines."""

from __future__ import annotations

import json
from collections import namedtuple
from dataclasses import dataclass
from datetime import UTC, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Q, Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from controlplane.core.costmodel import TIER_BYTES_PER_S
from controlplane.core.demand import demand_for
from controlplane.core.policy.demand import combined
from controlplane.core.policy.inputs import COLD_VALUE_S, EngineReport, engine_states, spec_room
from controlplane.core.policy.strategy import STRATEGY_PREDICTIVE
from controlplane.core.policy.types import (
    Budgets,
    Candidate,
    Demand,
    EngineState,
    Holding,
    Overrides,
)
from controlplane.demand.models import DemandBucket, WorkloadKey
from controlplane.fleet.choices import EngineLifecycle, NodeState
from controlplane.fleet.configured_index import get_index
from controlplane.fleet.models import Engine
from controlplane.forecasting.models import Forecast
from wire import blockhash
from wire.protocol import TIER_GPU

from ..choices import JobAction, JobState, OverrideKind
from ..models import Policy, ReplicationJob, SpeculativeReplica
from ..services import active_overrides
from .costs import cost_model_for
from .expected import expected_many


@dataclass
class Inputs:
    candidates: list[Candidate]
    demand: list[Demand]
    holdings: list[Holding]
    engines: list[EngineState]
    overrides: Overrides
    keys: dict[str, KeyRow]
    forecasters: dict[str, str]
    horizon_s: float  # the policy's horizon the demand is over


# Plain rows instead of model instances: a cycle reads 100k keys and forecasts, and building
# model objects was most of its time. JSON columns are read as text and decoded in one
# ``json.loads`` per query (Django's per-row JSON and datetime converters were the rest).
KeyRow = namedtuple("KeyRow", "pk tenant model chain prefix_tokens")
ForecastRow = namedtuple("ForecastRow", "key_id yhat bucket_s model burst_risk backtest_mase start")


def _decode_json_texts(texts: list[str]) -> list:
    """Many JSON documents (as the database returned them) decoded in a single call."""
    return json.loads("[" + ",".join(texts) + "]") if texts else []


def _workload_keys(only=None) -> dict[str, KeyRow]:
    qs = WorkloadKey.objects.all() if only is None else WorkloadKey.objects.filter(pk__in=only)
    rows = list(
        qs.exclude(prefix_keys=[])
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
        "key_id", "raw_yhat", "bucket_s", "model", "burst_risk", "backtest_mase", "raw_start"
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


def _holding_replicas(now=None):
    """Replicas whose hold has not ended and that did not leave: confirmed, partial, landed,
    and unconfirmed ones (a copy not shown yet may still be there), not shadow or held out."""
    now = now or timezone.now()
    return SpeculativeReplica.objects.filter(
        shadow=False, held_out=False, lost_at__isnull=True, expires_at__gt=now
    ).filter(Q(evicted_at__isnull=True) | Q(confirmed_at__isnull=True))


def _unsettled_jobs():
    return ReplicationJob.objects.filter(state__in=JobState.UNSETTLED, action=JobAction.REPLICATE)


def spec_bytes_by_engine(engine_ids: list[int] | None = None) -> dict[int, int]:
    """Bytes of speculative copies held on each engine or on their way there (held replicas,
    landed and unconfirmed ones included; live jobs, pending included): the one figure the
    planner and the approval budget both read."""
    held, coming = _holding_replicas(), _unsettled_jobs().exclude(state=JobState.LANDED)
    if engine_ids is not None:
        held, coming = (
            held.filter(engine_id__in=engine_ids),
            coming.filter(target_id__in=engine_ids),
        )
    out: dict[int, int] = {}
    for qs, field in ((held, "engine_id"), (coming, "target_id")):
        for engine, nbytes in qs.values_list(field).annotate(b=Sum("bytes")).order_by():
            out[engine] = out.get(engine, 0) + (nbytes or 0)
    return out


def chain_hex(keys) -> tuple[str, ...]:
    """A prefix chain in its one stored form: 16-digit lower-case hex, root first."""
    return tuple(blockhash.to_hex(k if isinstance(k, int) else blockhash.from_hex(k)) for k in keys)


def holders_to_be(now=None) -> dict[tuple[tuple[str, ...], int], str]:
    """(chain, engine) -> why, for every copy planned, moving, landed or held there (and every
    held-out pair within its would-be hold): one replica per (prefix, engine), so neither the
    planner nor an approval adds a second."""
    out: dict[tuple[tuple[str, ...], int], str] = {}
    for pk, chain, engine, state in _unsettled_jobs().values_list(
        "pk", "prefix_keys", "target_id", "state"
    ):
        out[(chain_hex(chain), engine)] = f"job {str(pk)[:8]} is {state}"
    replicas = SpeculativeReplica.objects.filter(
        shadow=False, lost_at__isnull=True, expires_at__gt=now or timezone.now()
    ).filter(Q(evicted_at__isnull=True) | Q(confirmed_at__isnull=True))
    for pk, chain, engine, held_out in replicas.values_list(
        "pk", "prefix_keys", "engine_id", "held_out"
    ):
        why = "held out" if held_out else "held"
        out.setdefault((chain_hex(chain), engine), f"replica #{pk} is {why} there")
    return out


# An engine's queue in seconds (``EngineState.queue_s``, what the planner charges a speculative
# item and backs off on) is its agent's last reading of vLLM's ``num_requests_waiting`` times
# what one request takes (``core.policy.inputs``): the cost model's prefill of the mean request
# gateways recorded for the engine's model over the last QUEUE_RECORDS_WINDOW_S (its uncached
# tokens after its cached ones).
# Without recent records, a QUEUE_FALLBACK_PROMPT_TOKENS-token prompt with nothing cached.
QUEUE_RECORDS_WINDOW_S = 600.0
QUEUE_FALLBACK_PROMPT_TOKENS = 2048


def request_s_by_model(models: set[str], now) -> dict[str, float]:
    """Per model name: the prefill seconds of the mean recently recorded request."""
    since = now - timedelta(seconds=QUEUE_RECORDS_WINDOW_S)
    rows = (
        DemandBucket.objects.filter(start__gte=since, key__model__in=models)
        .values_list("key__model")
        .annotate(
            n=Sum("requests"),
            prompt=Sum("prompt_tokens"),
            cached=Sum("cached_tokens"),
            served=Sum("served_records"),
        )
        .order_by()
    )
    seen = {m: (n or 0, p or 0, c or 0, sv or 0) for m, n, p, c, sv in rows}
    out = {}
    for m in models:
        cm = cost_model_for(m)
        n, prompt, cached, served = seen.get(m, (0, 0, 0, 0))
        if n:
            # cached tokens come only with records that name them (``served_records``)
            hit = cached / served if served else 0.0
            mean = prompt / n
            out[m] = cm.prefill_s(max(0.0, mean - hit), min(hit, mean))
        else:
            out[m] = cm.prefill_s(QUEUE_FALLBACK_PROMPT_TOKENS)
    return out


def _reading(metrics: dict, name: str) -> float | None:
    """A number the agent reported (None where it did not, or sent something else)."""
    v = metrics.get(name)
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    return max(0.0, float(v))


def engine_report(
    *,
    engine_id: str,
    node: str,
    lifecycle: str,
    capacity_bytes: float,
    resident_bytes: float,
    metrics: dict,
    request_s: float,
    spec_bytes: float,
    link_bytes_per_s: float,
    link_bytes_queued: float,
    cached: list[tuple[float, float]],
    starts_serving_in_s: float = 0.0,
    default_load: float = 0.5,
    slots: float = 1.0,
) -> EngineReport:
    """What one engine's agent reports, as the shared policy's ``EngineReport`` (the rules that
    turn it into the planner's view are ``core.policy.inputs``'): vLLM's waiting and running
    requests; the room from the residency the engine holds (``resident_bytes``; vLLM's
    ``kv_usage`` is the part running requests reference) and what that room holds (``cached``:
    ``(bytes, expected prefill seconds)`` of the forecast prefixes held there)."""
    waiting = _reading(metrics, "waiting")
    running = _reading(metrics, "running")
    slots = _reading(metrics, "slots") or slots
    if running is None:
        running = default_load * slots  # not reported: the configured load
    usage = _reading(metrics, "kv_usage")
    referenced = min(1.0, usage) * capacity_bytes if usage is not None else resident_bytes
    resident = max(resident_bytes, referenced)
    valued = sum(n for n, _ in cached)
    # Unreferenced cached blocks: the valued prefixes held there, and the rest at no value.
    rest = max(0.0, resident - referenced - valued)
    room, held = spec_room(
        free_bytes=max(0.0, capacity_bytes - resident),
        cached=[*cached, (rest, 0.0)] if rest else cached,
        cold_value_s=COLD_VALUE_S,
    )
    return EngineReport(
        engine_id=engine_id,
        node=node,
        lifecycle=lifecycle,
        kv_capacity_bytes=float(capacity_bytes),
        free_bytes=min(room, max(0.0, capacity_bytes - referenced)),
        spec_bytes=float(spec_bytes),
        waiting=waiting or 0.0,
        running=running or 0.0,
        slots=slots,
        request_s=request_s,
        link_bytes_per_s=link_bytes_per_s,
        link_bytes_queued=link_bytes_queued,
        displaced_s=held,
        starts_serving_in_s=starts_serving_in_s,
        tier_bytes_per_s=TIER_BYTES_PER_S,
    )


def link_bytes_in_flight() -> dict[int, float]:
    """Bytes of copies approved and not landed yet on each engine's link (source or target)."""
    out: dict[int, float] = {}
    jobs = ReplicationJob.objects.filter(state__in=JobState.IN_FLIGHT, action=JobAction.REPLICATE)
    for src, dst, nbytes in jobs.values_list("source_id", "target_id", "bytes"):
        for e in {src, dst} - {None}:
            out[e] = out.get(e, 0.0) + float(nbytes or 0)
    return out


def cached_values(
    cands: list[Candidate],
    demand: list[Demand],
    holdings: list[Holding],
) -> dict[str, list[tuple[float, float]]]:
    """Per engine: (bytes, expected prefill seconds over the horizon) of each candidate prefix
    it holds in HBM: its expected requests shared among its holders, times its recompute."""
    by_id = {c.prefix_id: c for c in cands}
    expected = {d.prefix_id: d.expected_requests for d in demand}
    gpu = [h for h in holdings if h.tier == TIER_GPU and h.prefix_id in by_id]
    count: dict[str, int] = {}
    for h in gpu:
        count[h.prefix_id] = count.get(h.prefix_id, 0) + 1
    out: dict[str, list[tuple[float, float]]] = {}
    for h in gpu:
        c = by_id[h.prefix_id]
        value = expected.get(h.prefix_id, 0.0) / count[h.prefix_id] * c.recompute_s
        out.setdefault(h.engine_id, []).append((float(c.nbytes), value))
    return out


def _engine_reports(
    engines: list[Engine], cached: dict[str, list[tuple[float, float]]], now=None
) -> list[EngineReport]:
    index = get_index()
    spec = spec_bytes_by_engine()
    per_request = request_s_by_model({e.model for e in engines}, now or timezone.now())
    link = link_bytes_in_flight()
    out = []
    for e in engines:
        warming = e.lifecycle == EngineLifecycle.WARMING
        out.append(
            engine_report(
                engine_id=str(e.pk),
                node=str(e.node_id),
                lifecycle=e.lifecycle,
                capacity_bytes=float(e.kv_capacity_bytes),
                resident_bytes=float(
                    index.usage(e.pk).blocks.get(TIER_GPU, 0) * (e.bytes_per_block or 0)
                ),
                metrics=e.metrics or {},
                request_s=per_request[e.model],
                spec_bytes=float(spec.get(e.pk, 0)),
                link_bytes_per_s=settings.PREWARM_LINK_BYTES_PER_S,
                link_bytes_queued=link.get(e.pk, 0.0),
                cached=cached.get(str(e.pk), []),
                starts_serving_in_s=settings.PREWARM_WARMING_LEAD_SECONDS if warming else 0.0,
                default_load=settings.PREWARM_DEFAULT_ENGINE_LOAD,
                slots=settings.PREWARM_ENGINE_SLOTS,
            )
        )
    return out


def gather(
    policy: Policy,
    now=None,
    measured: dict[int, float] | None = None,
    only: list[int] | None = None,
) -> Inputs:
    """Everything the planner needs, read once. ``measured``: workload key id -> requests/s
    measured now (``plans.measured``). Each key's demand is the shared rule's
    (``core.policy.demand``): its measured rate, held over the horizon, certain; under
    ``predictive`` its forecast adds what it sees beyond that with its confidence. ``only``: the
    keys of an ingest re-plan (default: every key with measured demand or, under predictive, a
    forecast)."""
    now = now or timezone.now()
    measured = measured or {}
    engines = list(Engine.objects.select_related("node").filter(node__state=NodeState.ACTIVE))
    by_model: dict[str, list[Engine]] = {}
    for e in engines:
        by_model.setdefault(e.model, []).append(e)
    predictive = policy.strategy == STRATEGY_PREDICTIVE
    if only is None and not predictive:
        only = list(measured)
    keys = _workload_keys(only)
    budgets = Budgets.of(policy)
    horizon = budgets.horizon_s
    forecasts = _latest_forecasts() if predictive else {}
    rows = [
        (pid, key, forecasts.get(key.pk))
        for pid, key in keys.items()
        if by_model.get(key.model) and (key.pk in forecasts or measured.get(key.pk, 0.0) > 0)
    ]
    expected = expected_many([f for _, _, f in rows if f is not None], now, horizon).tolist()
    cands, demand, forecasters = [], [], {}
    models = {m: cost_model_for(m) for m in {key.model for _, key, _ in rows}}
    # Service and recompute times depend only on (model, prefix tokens): a few distinct values.
    times: dict[tuple[str, int], tuple[float, float]] = {}
    forecast_expected = iter(expected)
    for pid, key, f in rows:
        peers, cm, chain = by_model[key.model], models[key.model], key.chain
        tokens = key.prefix_tokens or len(chain) * peers[0].block_size
        t = times.get((key.model, tokens))
        if t is None:  # a typical 256-token suffix after the prefix
            t = times[(key.model, tokens)] = (
                cm.prefill_s(256, tokens),
                cm.prefill_s(tokens) - cm.batch_overhead_s,
            )
        bpb = peers[0].bytes_per_block or int(cm.kv_bytes_per_token * peers[0].block_size)
        cands.append(Candidate(pid, chain, tokens, bpb * len(chain), key.tenant, t[0], t[1]))
        exp = next(forecast_expected) if f is not None else 0.0
        demand.append(demand_of(pid, measured.get(key.pk, 0.0), f, exp, budgets))
        if f is not None:
            forecasters[pid] = f.model
    # One batched residency read for every prefix (100k holders() calls were 100k round trips);
    # the planner copies only from engines holding the whole chain.
    index = get_index()
    holdings = [
        Holding(c.prefix_id, str(h.engine), h.tier)
        for c, found in zip(
            cands, index.full_holders_many([c.keys for c in cands], limit=64), strict=True
        )
        for h in found
    ]
    reports = _engine_reports(engines, cached_values(cands, demand, holdings), now)
    states = engine_states(reports, horizon_s=horizon)
    return Inputs(cands, demand, holdings, states, _overrides(), keys, forecasters, horizon)


def demand_of(
    pid: str, measured_rate: float, f: ForecastRow | None, expected: float, budgets: Budgets
) -> Demand:
    """One key's demand by the shared rule (``core.policy.demand.combined``): its measured rate,
    and its forecast's (``expected`` requests in the horizon, through the demand model the
    simulator shares, ``core.demand``) where there is one."""
    horizon = budgets.horizon_s
    forecast = None
    if f is not None:
        forecast = demand_for(
            pid,
            expected_requests=expected,
            horizon_s=horizon,
            burst_probability=f.burst_risk or 0.0,
            backtest_mase=f.backtest_mase,
        )
    return combined(
        pid,
        measured_rate=measured_rate,
        horizon_s=horizon,
        forecast=forecast,
        min_confidence=budgets.min_confidence,
    )


def _overrides() -> Overrides:
    ov = list(active_overrides())
    return Overrides(
        excluded_engines=frozenset(
            str(o.engine_id) for o in ov if o.kind == OverrideKind.EXCLUDE_ENGINE
        ),
        excluded_nodes=frozenset(str(o.node_id) for o in ov if o.kind == OverrideKind.EXCLUDE_NODE),
        frozen=any(o.kind == OverrideKind.FREEZE for o in ov),
    )
