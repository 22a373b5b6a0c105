"""Request records -> workload keys and demand buckets."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from controlplane.core.errors import Invalid
from controlplane.core.prefix_groups import OTHER, group_of, shared_chain
from controlplane.fleet.models import Engine
from wire import blockhash

from . import misses
from .models import DemandBucket, MissBucket, WorkloadKey
from .signals import records_ingested, requests_served

log = logging.getLogger(__name__)
MAX_GROUPS_PER_TENANT_MODEL = 64
GROUP_TOKENS = 1024
HOUR = 3600
# A demand bucket's counters, in the order ingest counts them.
BUCKET_COUNTS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "served_records",
    "gateway_requests",
    "gateway_served_records",
)


def _keys_of(record: dict) -> list[int]:
    if "keys" in record:
        return [int(k, 16) for k in record["keys"]]
    return blockhash.chain_keys(
        record["token_ids"], record["block_size"], blockhash.extra_for(record.get("lora_name"))
    )


class UnknownEngine(Invalid, ValueError):
    """A record names a serving engine Prewarm does not know (400 on the API)."""

    code = "unknown_engine"

    def __init__(self, detail: str):
        super().__init__(detail, field="records.engine")


def _serving_engines(records: list[dict]) -> dict[str, int]:
    """Each record's ``engine`` (an engine id, or 'node/engine_id') -> the engine's id."""
    refs = {str(r["engine"]) for r in records if r.get("engine") not in (None, "")}
    if not refs:
        return {}
    ids = {ref: int(ref) for ref in refs if ref.isdigit()}
    named = [ref.split("/", 1) for ref in refs if not ref.isdigit() and "/" in ref]
    found = set(Engine.objects.filter(pk__in=ids.values()).values_list("pk", flat=True))
    out = {ref: pk for ref, pk in ids.items() if pk in found}
    if named:
        q = Q()
        for node, eid in named:
            q |= Q(node__name=node, engine_id=eid)
        for pk, node, eid in Engine.objects.filter(q).values_list("pk", "node__name", "engine_id"):
            out[f"{node}/{eid}"] = pk
    missing = sorted(refs - set(out))
    if missing:
        raise UnknownEngine(
            f"unknown serving engine {missing[0]!r}: give the engine's id as the "
            "residency lookup names it, or 'node/engine_id'"
        )
    return out


def group_name(chain: list[int], block_size: int) -> str:
    """The prefix group a request of this chain counts under (docs/api.md)."""
    head = group_of(chain, block_size, GROUP_TOKENS)
    return OTHER if head is None else blockhash.to_hex(head)


class KeyResolver:
    """Workload keys of (tenant, model, group) idents, created where missing, under the cap of
    ``MAX_GROUPS_PER_TENANT_MODEL`` groups per tenant and model (a group past it counts under
    "*"). Used inside the caller's transaction; ``created`` counts the keys it made."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, str, str], WorkloadKey] = {}
        self.group_counts: dict[tuple[str, str], int] = {}
        self.created = 0

    def resolve(
        self, idents: set[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], tuple[WorkloadKey, str]]:
        """ident -> (its workload key, the group it counts under)."""
        # Created where missing in sorted order: two web processes ingesting overlapping
        # batches then take the unique index's locks in the same order and cannot deadlock
        # (PostgreSQL's "deadlock detected ... workload_key_unique").
        return {asked: self._one(asked) for asked in sorted(idents)}

    def _one(self, asked: tuple[str, str, str]) -> tuple[WorkloadKey, str]:
        ident, group = asked, asked[2]
        wk = self.cache.get(ident)
        if wk is None:
            wk = WorkloadKey.objects.filter(
                tenant=ident[0], model=ident[1], prefix_group=group
            ).first()
            if wk is None:
                tm = ident[:2]
                if tm not in self.group_counts:
                    self.group_counts[tm] = WorkloadKey.objects.filter(
                        tenant=tm[0], model=tm[1]
                    ).count()
                if group != OTHER and self.group_counts[tm] >= MAX_GROUPS_PER_TENANT_MODEL:
                    group, ident = OTHER, (tm[0], tm[1], OTHER)
                    wk = (
                        self.cache.get(ident)
                        or WorkloadKey.objects.filter(
                            tenant=tm[0], model=tm[1], prefix_group=OTHER
                        ).first()
                    )
                if wk is None:
                    # get_or_create: another web process may create the same key at the same
                    # moment (bench/load.py with 2 processes hit UniqueViolation -> 500 here).
                    wk, made = WorkloadKey.objects.get_or_create(
                        tenant=ident[0], model=ident[1], prefix_group=group
                    )
                    self.group_counts[tm] = self.group_counts.get(tm, 0) + made
                    self.created += made
            self.cache[ident] = wk
        return wk, group


def narrow_prefix(wk: WorkloadKey, chain: list[int], block_size: int) -> None:
    """The key's shared chain becomes what it and one more request of it share (saved by the
    caller when ``wk._dirty``)."""
    current = [int(k, 16) for k in wk.prefix_keys] if wk.prefix_keys else None
    common = shared_chain(current, chain)
    if current is None or len(common) != len(current):
        wk.prefix_keys = [blockhash.to_hex(k) for k in common]
        wk.prefix_tokens = len(common) * block_size
        wk._dirty = True


@transaction.atomic
def ingest_records(records: list[dict], *, from_gateway: bool = True) -> dict:
    """Roll a batch of validated request records into buckets, all or nothing.

    ``from_gateway``: a gateway's records (it sees every engine's requests) or an agent's taps'
    (its own engine's only). Both count as demand; only a gateway's feed the estimates made over
    every engine (``DemandBucket.gateway_*``), and the scores take an agent's records only for
    its own engine (``served`` rows say which).

    Records that name their serving engine and cached tokens (``engine``, ``cached_tokens``)
    also count, per speculative replica of that engine and key, the requests it served during
    its hold and the hits among them (cached tokens covering its prefix): scores from served
    requests, not estimates. An unknown engine refuses the batch (``UnknownEngine``)."""
    bucket_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    now = timezone.now()
    engines = _serving_engines(records)
    parsed = []
    for rec in records:
        chain = _keys_of(rec)
        parsed.append(
            (rec, chain, (rec["tenant"], rec["model"], group_name(chain, rec["block_size"])))
        )
    keys = KeyResolver()
    resolved = keys.resolve({ident for _, _, ident in parsed})
    batch = _BatchCounts(engines, bucket_s, now, from_gateway)
    for rec, chain, ident in parsed:
        batch.add(rec, chain, *resolved[ident])
    _save_keys(keys, batch.first, now)
    _add_to_buckets(batch.counts, bucket_s)
    # Each served request's hit or miss reason, against the residency of this moment.
    if batch.served_chains:
        misses.count(_served_rows(batch.served_chains, batch.served), bucket_s)
    # Replication credits its replicas with the requests they served (it sits above demand).
    requests_served.send(sender=ingest_records, served=batch.served)
    # ... and reacts to a hot spot or a burst's onset within seconds (replication.plans.react).
    records_ingested.send(sender=ingest_records, arrivals=dict(batch.arrivals))
    if settings.PREWARM_OTEL_EXPORT and engines:
        transaction.on_commit(lambda: _export_spans(records, engines))
    return {
        "accepted": len(records),
        "buckets_touched": len(batch.counts),
        "workload_keys_created": keys.created,
    }


class _BatchCounts:
    """What a batch of records adds, per workload key: demand per bucket (requests, prompt
    tokens, cached tokens, served records, and the gateway's share of requests and served
    records), served rows, arrival times and its earliest record."""

    def __init__(self, engines: dict[str, int], bucket_s: int, now, from_gateway: bool) -> None:
        self.engines, self.bucket_s = engines, bucket_s
        self.now, self.from_gateway = now, from_gateway
        self.keep_tokens = settings.PREWARM_KEEP_PREFIX_TOKEN_IDS
        self.reasons = settings.PREWARM_MISS_REASONS
        self.counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
        self.served: list[tuple[int, int, float, int, float | None, bool]] = []
        self.served_chains: list[tuple[WorkloadKey, str, list[int], dict]] = []
        self.arrivals: dict[int, list[float]] = defaultdict(list)
        self.first: dict[int, float] = {}  # each key's earliest record of the batch

    def add(self, rec: dict, chain: list[int], wk: WorkloadKey, group: str) -> None:
        """One record of ``wk`` (counted under ``group``); narrows the key's shared prefix."""
        self.first[wk.pk] = min(self.first.get(wk.pk, rec["time"]), rec["time"])
        if group != OTHER:
            self.arrivals[wk.pk].append(float(rec["time"]))
            narrow_prefix(wk, chain, rec["block_size"])
        if (
            self.keep_tokens
            and "token_ids" in rec
            and wk.token_ids_wanted_until
            and wk.token_ids_wanted_until > self.now
            and wk.prefix_keys
            and group != OTHER
        ):
            _keep_prefix_tokens(wk, rec, chain)
        start = int(rec["time"] // self.bucket_s * self.bucket_s)
        c = self.counts[(wk.pk, start)]
        c[0] += 1
        c[1] += rec.get("prompt_tokens") or len(chain) * rec["block_size"]
        c[2] += rec.get("cached_tokens", 0)
        c[4] += self.from_gateway
        if rec.get("engine") not in (None, "") and "cached_tokens" in rec:
            c[3] += 1
            c[5] += self.from_gateway
            self.served.append(
                (
                    wk.pk,
                    self.engines[str(rec["engine"])],
                    rec["time"],
                    rec["cached_tokens"],
                    rec.get("ttft_s"),
                    self.from_gateway,
                )
            )
            if self.reasons:
                self.served_chains.append((wk, group, chain, rec))


def _save_keys(keys: KeyResolver, first: dict[int, float], now) -> None:
    """The batch's workload keys seen now, live from their first records, their narrowed
    prefixes and kept token ids saved."""
    for wk in sorted(keys.cache.values(), key=lambda w: w.pk):  # row locks in one order
        fields = ["last_seen"]
        wk.last_seen = now
        if wk.live_since is None:  # its first live records (history imports stop there)
            wk.live_since = datetime.fromtimestamp(first[wk.pk], tz=UTC)
            fields.append("live_since")
        if getattr(wk, "_dirty", False):
            fields += ["prefix_keys", "prefix_tokens"]
        if getattr(wk, "_tokens_dirty", False):
            fields.append("prefix_token_ids")
        wk.save(update_fields=fields)


def _add_to_buckets(counts: dict[tuple[int, int], list[int]], bucket_s: int) -> None:
    """Each (key, bucket start)'s counts added to its ``DemandBucket``."""
    for (key_id, start), c in sorted(counts.items()):
        _add_to_bucket(key_id, datetime.fromtimestamp(start, tz=UTC), bucket_s, c)


def _add_to_bucket(key_id: int, start: datetime, seconds: int, counts: list[int]) -> None:
    """Add ``counts`` (in ``BUCKET_COUNTS`` order) to the key's bucket at ``start``, made with
    them where missing."""
    values = dict(zip(BUCKET_COUNTS, counts, strict=True))
    bucket, made = DemandBucket.objects.get_or_create(
        key_id=key_id, start=start, seconds=seconds, defaults=values
    )
    if not made:
        DemandBucket.objects.filter(pk=bucket.pk).update(**{c: F(c) + n for c, n in values.items()})


def _export_spans(records: list[dict], engines: dict[str, int]) -> None:
    """The batch's served records as OpenTelemetry GenAI spans (``otel.py``), after commit."""
    from . import otel

    rows = Engine.objects.filter(pk__in=set(engines.values())).values(
        "pk", "kind", "model", "endpoints"
    )
    by_pk = {row["pk"]: row for row in rows}
    served = {ref: {**by_pk[pk], "ref": ref} for ref, pk in engines.items() if pk in by_pk}
    try:
        otel.export(records, served)
    except Exception:  # an exporter's fault never fails ingestion, which has committed
        log.exception("OpenTelemetry export of %d request records failed", len(records))


def _served_rows(
    chains: list[tuple[WorkloadKey, str, list[int], dict]],
    served: list[tuple[int, int, float, int, float | None, bool]],
) -> list[misses.Served]:
    """The served records, each judged on its key's shared chain as the batch left it."""
    prefixes: dict[int, tuple[int, ...]] = {}
    rows = []
    for (wk, group, chain, rec), (key_id, engine, t, cached, *_rest) in zip(
        chains, served, strict=True
    ):
        prefix = prefixes.get(key_id) if group != OTHER else None
        if prefix is None:
            keys = wk.prefix_keys if group != OTHER else []
            prefix = misses.prefix_of(keys, chain, rec["block_size"])
            if group != OTHER:
                prefixes[key_id] = prefix
        rows.append(
            misses.Served(
                key_id,
                engine,
                t,
                cached,
                rec["block_size"],
                prefix,
                rec.get("predicted_cached_tokens"),
            )
        )
    return rows


def _keep_prefix_tokens(wk: WorkloadKey, rec: dict, chain: list[int]) -> None:
    """Keep the token ids of ``wk``'s shared prefix from a record that carries them (only for
    keys a plan uses: executors that address KV by tokens need them)."""
    n = len(wk.prefix_keys)
    if len(wk.prefix_token_ids) == n * rec["block_size"]:
        return  # already kept for this prefix
    if [blockhash.to_hex(k) for k in chain[:n]] != wk.prefix_keys:
        return  # the record does not start with the key's prefix (another block size)
    wk.prefix_token_ids = list(rec["token_ids"][: n * rec["block_size"]])
    wk._tokens_dirty = True


def want_prefix_tokens(key_ids, now=None) -> int:
    """A plan uses these workload keys: keep their prefixes' token ids for the retention time
    (``PREWARM_PREFIX_TOKEN_IDS_KEEP_SECONDS``) from the next record that carries them."""
    if not settings.PREWARM_KEEP_PREFIX_TOKEN_IDS:
        return 0
    now = now or timezone.now()
    until = now + timedelta(seconds=settings.PREWARM_PREFIX_TOKEN_IDS_KEEP_SECONDS)
    return WorkloadKey.objects.filter(pk__in=list(key_ids)).update(token_ids_wanted_until=until)


def forget_prefix_tokens(now=None) -> int:
    """Token ids no plan has used within the retention time (or all, when keeping is off)."""
    now = now or timezone.now()
    stale = WorkloadKey.objects.exclude(prefix_token_ids=[])
    if settings.PREWARM_KEEP_PREFIX_TOKEN_IDS:
        stale = stale.filter(
            Q(token_ids_wanted_until__isnull=True) | Q(token_ids_wanted_until__lte=now)
        )
    return stale.update(prefix_token_ids=[])


@transaction.atomic
def downsample_demand(now=None) -> dict:
    """Fine buckets past the forecaster's window are summed into hourly ones; past the last
    horizon, buckets are deleted. Request counts are preserved by the roll-up."""
    now = now or timezone.now()
    fine_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
    cutoff = (now - timedelta(days=settings.PREWARM_DEMAND_FINE_DAYS)).replace(
        minute=0, second=0, microsecond=0
    )
    deleted, _ = DemandBucket.objects.filter(
        start__lt=now - timedelta(days=settings.PREWARM_DEMAND_DAYS)
    ).delete()
    miss_deleted, _ = MissBucket.objects.filter(
        start__lt=now - timedelta(days=settings.PREWARM_DEMAND_DAYS)
    ).delete()
    if fine_s >= HOUR:
        return {
            "demand_buckets_deleted": deleted,
            "demand_buckets_merged": 0,
            "miss_buckets_deleted": miss_deleted,
            "miss_buckets_merged": 0,
        }
    fine = DemandBucket.objects.filter(seconds=fine_s, start__lt=cutoff)
    sums = (
        fine.annotate(hour=TruncHour("start"))
        .values("key_id", "hour")
        .annotate(**{f"s_{c}": Sum(c) for c in BUCKET_COUNTS})
    )
    for row in sums:
        _add_to_bucket(row["key_id"], row["hour"], HOUR, [row[f"s_{c}"] for c in BUCKET_COUNTS])
    merged, _ = fine.delete()
    return {
        "demand_buckets_deleted": deleted,
        "demand_buckets_merged": merged,
        "miss_buckets_deleted": miss_deleted,
        "miss_buckets_merged": _roll_up_misses(fine_s, cutoff),
    }


def _roll_up_misses(fine_s: int, cutoff) -> int:
    """Fine miss buckets before ``cutoff`` summed into hourly ones (as demand buckets are)."""
    fine = MissBucket.objects.filter(seconds=fine_s, start__lt=cutoff)
    sums = (
        fine.annotate(hour=TruncHour("start"))
        .values("key_id", "engine_id", "hour")
        .annotate(**{f"s_{c}": Sum(c) for c in misses.MISS_COUNTERS})
    )
    for row in sums:
        values = {c: row[f"s_{c}"] or 0 for c in misses.MISS_COUNTERS}
        bucket, made = MissBucket.objects.get_or_create(
            key_id=row["key_id"],
            engine_id=row["engine_id"],
            start=row["hour"],
            seconds=HOUR,
            defaults=values,
        )
        if not made:
            MissBucket.objects.filter(pk=bucket.pk).update(
                **{c: F(c) + n for c, n in values.items()}
            )
    merged, _ = fine.delete()
    return merged
