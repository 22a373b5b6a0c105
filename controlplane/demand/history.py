"""Past request history into the demand buckets: ``manage.py import_history`` and
``POST /api/history-imports/`` (docs/api.md, "Request history").

A file is read as rows (``controlplane.core.history``), each row's workload key is found as a
live request record's would be (tenant, model, the prefix group of its chain, or the group it
names), and its requests are added to that key's buckets, one transaction for the whole file:
a row that cannot be read refuses the import with its line and leaves nothing behind. The rows
are counted in chunks as they are read, so a file of any length takes bounded memory.

What keeps an import from counting a request twice:
- the file's SHA-256: the same bytes import once (a second try answers with the first import);
- a row at or after its workload key's first live request record (``live_since``) is skipped:
  from then on the live records count that key's demand;
- with a ``source`` (e.g. one engine's log), rows at or before the newest row an earlier import
  from that source counted are skipped, so a log that grew can be imported again for its tail.
Rows older than ``PREWARM_DEMAND_DAYS`` are skipped (retention would delete them); rows older
than ``PREWARM_DEMAND_FINE_DAYS`` go straight into hourly buckets, as retention would roll them.
"""

from __future__ import annotations

import hashlib
import io
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from controlplane.audit.services import actor_of, record, snapshot
from controlplane.core.errors import Invalid
from controlplane.core.history import Defaults, HistoryError, HistoryRow, read, spread
from controlplane.core.prefix_groups import OTHER

from .models import DemandBucket, HistoryImport, WorkloadKey
from .services import HOUR, KeyResolver, group_name, narrow_prefix

CHUNK_ROWS = 20_000  # rows counted and written at a time
FUTURE_SLACK_S = 60.0  # a row this far past now is refused (a log from a skewed clock)
READ_BYTES = 1 << 20


class BadHistory(Invalid):
    """A line of the history cannot be read: nothing was imported (400, names the line)."""

    code = "bad_history_row"

    def __init__(self, exc: HistoryError):
        super().__init__(str(exc), field="file", line=exc.line)


def file_sha256(f: IO[bytes]) -> str:
    """SHA-256 of a seekable binary file's bytes; the file is left at its start."""
    f.seek(0)
    h = hashlib.sha256()
    while chunk := f.read(READ_BYTES):
        h.update(chunk)
    f.seek(0)
    return h.hexdigest()


def _lines(f: IO[bytes]) -> Iterator[str]:
    for no, raw in enumerate(f, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise HistoryError(no, "not UTF-8 text") from None


def import_history(
    f: IO[bytes],
    *,
    fmt: str = "auto",
    defaults: Defaults | None = None,
    source: str = "",
    filename: str = "",
    who: Any = None,
    now: datetime | None = None,
) -> tuple[HistoryImport, bool]:
    """Import one history file (a seekable binary file), all or nothing: (the import, whether
    these bytes were imported before). The same bytes a second time change nothing and answer
    with the first import."""
    sha = file_sha256(f)
    done = HistoryImport.objects.filter(sha256=sha).first()
    if done is not None:
        return done, True
    try:
        imp = _import(f, sha, fmt, defaults or Defaults(), source, filename, who, now)
    except HistoryError as exc:
        raise BadHistory(exc) from None
    except IntegrityError:
        done = HistoryImport.objects.filter(sha256=sha).first()
        if done is None:
            raise
        return done, True  # the same file, imported at the same moment
    return imp, False


@transaction.atomic
def _import(f, sha, fmt, defaults, source, filename, who, now) -> HistoryImport:
    t0 = time.perf_counter()
    now = now or timezone.now()
    imp = HistoryImport.objects.create(
        sha256=sha,
        source=source,
        format=fmt,
        filename=filename[:255],
        imported_by=actor_of(who)[1],
    )
    seen = None
    if source:
        seen = (
            HistoryImport.objects.filter(source=source)
            .exclude(pk=imp.pk)
            .aggregate(t=Max("last_time"))["t"]
        )
    counter = _Counter(imp, now, seen.timestamp() if seen else None)
    chunk: list[HistoryRow] = []
    lines = _lines(f)
    for row in read(_counted(lines, counter), fmt, defaults):
        chunk.append(row)
        if len(chunk) >= CHUNK_ROWS:
            counter.add(chunk)
            chunk = []
    if chunk:
        counter.add(chunk)
    counter.finish()
    imp.seconds = round(time.perf_counter() - t0, 3)
    imp.save()
    record(who, "history.imported", imp, after=snapshot(imp), reason=filename[:200])
    return imp


def _counted(lines: Iterator[str], counter: _Counter) -> Iterator[str]:
    for line in lines:
        counter.imp.lines += 1
        yield line


class _Counter:
    """Rows -> workload keys and bucket counts, written chunk by chunk in the caller's
    transaction."""

    def __init__(self, imp: HistoryImport, now: datetime, seen: float | None) -> None:
        self.imp = imp
        self.now = now.timestamp()
        self.seen = seen
        self.fine_s = settings.PREWARM_DEMAND_BUCKET_SECONDS
        self.oldest = self.now - settings.PREWARM_DEMAND_DAYS * 86400
        # Older than this: an hourly bucket, as retention (``downsample_demand``) would make it.
        cutoff = now - timedelta(days=settings.PREWARM_DEMAND_FINE_DAYS)
        self.fine_from = cutoff.replace(minute=0, second=0, microsecond=0).timestamp()
        if self.fine_s >= HOUR:
            self.fine_from = -math.inf
        self.keys = KeyResolver()
        self.resolved: dict[tuple[str, str, str], tuple[WorkloadKey, str]] = {}
        self.newest: dict[int, float] = {}
        self.first = math.inf
        self.last = -math.inf

    def add(self, rows: list[HistoryRow]) -> None:
        idents = [
            (r.tenant, r.model, r.prefix_group or group_name(r.chain or [], r.block_size))
            for r in rows
        ]
        self.resolved.update(self.keys.resolve(set(idents) - set(self.resolved)))
        counts: dict[tuple[int, int, int], list[int]] = defaultdict(lambda: [0, 0, 0])
        imp = self.imp
        for r, ident in zip(rows, idents, strict=True):
            if r.time > self.now + FUTURE_SLACK_S:
                raise HistoryError(r.line, f"time {r.time:.0f} is in the future")
            wk, group = self.resolved[ident]
            live_from = wk.live_since.timestamp() if wk.live_since else math.inf
            if r.chain and group != OTHER:
                narrow_prefix(wk, r.chain, r.block_size)
            k = max(1, round(r.seconds / self.fine_s)) if r.seconds > 0 else 1
            step = r.seconds / k
            counted = False
            for i, (n, toks, cached) in enumerate(
                zip(
                    spread(r.requests, k),
                    spread(r.prompt_tokens, k),
                    spread(r.cached_tokens, k),
                    strict=True,
                )
            ):
                t = r.time + i * step
                if t >= live_from:
                    imp.skipped_live += n
                elif t < self.oldest:
                    imp.skipped_old += n
                elif self.seen is not None and t <= self.seen + 1e-6:  # stored to the microsecond
                    imp.skipped_seen += n
                elif n or toks:
                    s = self.fine_s if t >= self.fine_from else HOUR
                    c = counts[(wk.pk, s, int(t // s * s))]
                    c[0] += n
                    c[1] += toks
                    c[2] += cached
                    imp.requests += n
                    counted = True
                    self.first = min(self.first, t)
                    self.last = max(self.last, t)
                    self.newest[wk.pk] = max(self.newest.get(wk.pk, t), t)
            imp.rows += counted
        self._write(counts)

    def _write(self, counts: dict[tuple[int, int, int], list[int]]) -> None:
        if not counts:
            return
        starts = [s for _, _, s in counts]
        existing = {
            (key_id, seconds, int(start.timestamp())): pk
            for pk, key_id, seconds, start in DemandBucket.objects.filter(
                key_id__in={k for k, _, _ in counts},
                start__gte=datetime.fromtimestamp(min(starts), tz=UTC),
                start__lte=datetime.fromtimestamp(max(starts), tz=UTC),
            ).values_list("pk", "key_id", "seconds", "start")
        }
        new = []
        for ident, (n, toks, cached) in sorted(counts.items()):
            pk = existing.get(ident)
            if pk is None:
                new.append((*ident, n, toks, cached))
                continue
            DemandBucket.objects.filter(pk=pk).update(
                requests=F("requests") + n,
                prompt_tokens=F("prompt_tokens") + toks,
                cached_tokens=F("cached_tokens") + cached,
            )
            self.imp.buckets_updated += 1
        insert_buckets(new)
        self.imp.buckets_created += len(new)

    def finish(self) -> None:
        imp = self.imp
        for wk in sorted(self.keys.cache.values(), key=lambda w: w.pk):  # row locks in one order
            fields = []
            newest = self.newest.get(wk.pk)
            if newest is not None and (wk.last_seen is None or wk.last_seen.timestamp() < newest):
                wk.last_seen = datetime.fromtimestamp(newest, tz=UTC)
                fields.append("last_seen")
            if getattr(wk, "_dirty", False):
                fields += ["prefix_keys", "prefix_tokens"]
            if fields:
                wk.save(update_fields=fields)
        imp.workload_keys = len({wk.pk for wk in self.keys.cache.values()})
        imp.workload_keys_created = self.keys.created
        if imp.requests:
            imp.first_time = datetime.fromtimestamp(self.first, tz=UTC)
            imp.last_time = datetime.fromtimestamp(self.last, tz=UTC)


def insert_buckets(rows: list[tuple[int, int, int, int, int, int]]) -> None:
    """New demand buckets (key id, seconds, start unix, requests, prompt tokens, cached
    tokens): COPY on PostgreSQL, one ``executemany`` elsewhere (building a model object per
    bucket for ``bulk_create`` took most of a large import's time). None of their requests is a
    gateway's live record (``gateway_*``: what replicas' estimated hits read)."""
    if not rows:
        return
    table = DemandBucket._meta.db_table
    cols = (
        "key_id, start, seconds, requests, prompt_tokens, cached_tokens, served_records, "
        "gateway_requests, gateway_served_records"
    )
    if connection.vendor == "postgresql":
        buf = io.StringIO()
        for k, s, t, n, toks, cached in rows:
            start = datetime.fromtimestamp(t, tz=UTC).isoformat()
            buf.write(f"{k}\t{start}\t{s}\t{n}\t{toks}\t{cached}\t0\t0\t0\n")
        with (
            connection.cursor() as cur,
            cur.cursor.copy(f"COPY {table} ({cols}) FROM STDIN") as copy,
        ):
            copy.write(buf.getvalue())
        return
    adapt = connection.ops.adapt_datetimefield_value
    starts = {t: adapt(datetime.fromtimestamp(t, tz=UTC)) for t in {r[2] for r in rows}}
    params = [(k, starts[t], s, n, toks, cached, 0, 0, 0) for k, s, t, n, toks, cached in rows]
    marks = ", ".join(["%s"] * 9)
    with connection.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", params)
