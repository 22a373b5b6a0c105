"""Miss reasons decided at ingest: the facts of each served record, classified by
``controlplane/core/misses.py`` and counted into ``MissBucket`` rows (no per-request rows).

The facts come from the residency index of the moment (other engines' holdings, the serving
engine's recent removals) and from the copies in flight, which replication owns: it sits above
demand, so it registers a provider here (``register_copies_in_flight``, from its AppConfig) and
demand never imports it. Without a provider nothing is ``warming``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import NamedTuple

from django.conf import settings

from controlplane.core import misses as m
from controlplane.core.prefix_groups import group_depth
from controlplane.fleet.configured_index import get_index

from .models import MissBucket

# (target engine id, the copy's first block key, started unix s, landed unix s or None) for
# copies to any of ``targets`` in flight now or landed since ``since`` (unix s).
CopiesInFlight = Callable[[set[int], float], Iterable[tuple[int, int, float, float | None]]]
_providers: list[CopiesInFlight] = []


def register_copies_in_flight(provider: CopiesInFlight) -> None:
    """Called once by the app that owns replication jobs (idempotent)."""
    if provider not in _providers:
        _providers.append(provider)


class Served(NamedTuple):
    """One ingested record that named its serving engine and cached tokens."""

    key_id: int
    engine: int
    time: float
    cached_tokens: int
    block_size: int
    prefix: tuple[int, ...]  # the workload key's shared chain (or the record's group head)
    predicted: int | None  # predicted_cached_tokens, when the gateway sent it


def prefix_of(prefix_keys: list[str], chain: list[int], block_size: int) -> tuple[int, ...]:
    """The chain a record's hit is judged on: its key's shared chain, else its group's head."""
    if prefix_keys:
        return tuple(int(k, 16) for k in prefix_keys)
    return tuple(chain[: group_depth(block_size, 1024)])


def classify_served(rows: list[Served]) -> list[tuple[Served, m.Facts, str]]:
    """Each row's facts and reason, against the index and copies of this moment."""
    if not rows:
        return []
    index = get_index()
    chains = list({r.prefix for r in rows if r.prefix})
    # The two deepest holders: the deepest that is not the serving engine is among them.
    best = dict(zip(chains, index.holders_many(chains, limit=2), strict=True))
    lag = settings.PREWARM_MISS_REPORT_LAG_SECONDS
    facts: list[m.Facts] = []
    cold_rows: list[int] = []
    for i, r in enumerate(rows):
        others = next((h.depth for h in best.get(r.prefix, ()) if h.engine != r.engine), 0)
        f = m.Facts(
            prefix_blocks=max(1, len(r.prefix)),
            cached_blocks=r.cached_tokens // r.block_size,
            others_depth=others,
        )
        facts.append(f)
        if f.cached_blocks == 0 and r.prefix:
            cold_rows.append(i)
    if cold_rows:
        _warming(rows, facts, cold_rows, lag)
        rest = [i for i in cold_rows if not facts[i].warming]
        if rest:
            at = index.removed_at_many([(rows[i].engine, rows[i].prefix[0]) for i in rest])
            window = settings.PREWARM_REMOVALS_KEEP_SECONDS
            for i, removed in zip(rest, at, strict=True):
                if m.removed_in_window(removed, rows[i].time, window, lag):
                    facts[i] = replace(facts[i], evicted=True)
    return [(r, f, m.classify(f)) for r, f in zip(rows, facts, strict=True)]


def _warming(rows: list[Served], facts: list[m.Facts], idx: list[int], lag: float) -> None:
    if not _providers:
        return
    targets = {rows[i].engine for i in idx}
    since = min(rows[i].time for i in idx) - lag
    copies: dict[tuple[int, int], list[tuple[float, float | None]]] = defaultdict(list)
    for provider in _providers:
        for target, first, started, ended in provider(targets, since):
            copies[(target, first)].append((started, ended))
    if not copies:
        return
    for i in idx:
        r = rows[i]
        spans = copies.get((r.engine, r.prefix[0]), ())
        if any(m.in_flight_at(s, e, r.time, lag) for s, e in spans):
            facts[i] = replace(facts[i], warming=True)


def count(rows: list[Served], bucket_s: int) -> int:
    """Classify ``rows`` and add them to their miss buckets; returns the buckets touched."""
    sums: dict[tuple[int, int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r, f, reason in classify_served(rows):
        s = sums[(r.key_id, r.engine, int(r.time // bucket_s * bucket_s))]
        s[reason] += 1
        s["sol_hits"] += m.speed_of_light_hit(f)
        s["prefix_tokens"] += f.prefix_blocks * r.block_size
        s["cached_tokens"] += r.cached_tokens
        s["sol_cached_tokens"] += m.speed_of_light_blocks(f) * r.block_size
        if r.predicted is not None:
            s["predicted_records"] += 1
            s["predicted_cached_tokens"] += r.predicted
            s["predicted_delivered_tokens"] += r.cached_tokens
    _upsert(sums, bucket_s)
    return len(sums)


# MissBucket's counters: a roll-up sums each of them.
MISS_COUNTERS = (
    *m.REASONS,
    "sol_hits",
    "prefix_tokens",
    "cached_tokens",
    "sol_cached_tokens",
    "predicted_records",
    "predicted_cached_tokens",
    "predicted_delivered_tokens",
)

UPSERT_ROWS = 500  # rows per INSERT statement


def _upsert(sums: dict[tuple[int, int, int], dict[str, int]], bucket_s: int) -> None:
    """Add ``sums`` to their buckets with INSERT ... ON CONFLICT DO UPDATE (SQLite and
    PostgreSQL): one statement per UPSERT_ROWS buckets, atomic against another web process
    adding to the same bucket, rows in key order (locks taken in one order)."""
    from django.db import connection

    table = connection.ops.quote_name(MissBucket._meta.db_table)
    q = connection.ops.quote_name
    cols = ["key_id", "engine_id", "start", "seconds", *MISS_COUNTERS]
    conflict = ", ".join(q(c) for c in ("key_id", "engine_id", "start", "seconds"))
    update = ", ".join(f"{q(c)} = {table}.{q(c)} + excluded.{q(c)}" for c in MISS_COUNTERS)
    head = f"INSERT INTO {table} ({', '.join(q(c) for c in cols)}) VALUES "
    tail = f" ON CONFLICT ({conflict}) DO UPDATE SET {update}"
    one = "(" + ", ".join(["%s"] * len(cols)) + ")"
    adapt = connection.ops.adapt_datetimefield_value
    items = sorted(sums.items())
    with connection.cursor() as cursor:
        for i in range(0, len(items), UPSERT_ROWS):
            part = items[i : i + UPSERT_ROWS]
            params: list = []
            for (key_id, engine, start), values in part:
                at = adapt(datetime.fromtimestamp(start, tz=UTC))
                params += [key_id, engine, at, bucket_s, *(values.get(c, 0) for c in MISS_COUNTERS)]
            cursor.execute(head + ", ".join([one] * len(part)) + tail, params)
