"""Residency index in Redis, shared by every web and worker process in production.

Layout (version 2; all under one hash tag so a Redis Cluster keeps them in one slot and scripts
stay atomic):
  {ns}:k             hash key hex -> holders, "engine:mask,engine:mask" (media mask GPU=1, CPU=2,
                     DISK=4); one hash for every block instead of one Redis key per block, so a
                     report of 5,000 deltas is a few chunked HMGET/HSET calls, not 5,000 HSETs
  {ns}:e:<engine>    hash key hex -> media bitmask
  {ns}:p             hash key hex -> parent key hex, of the keys some engine holds (a key that
                     leaves every engine takes its parent with it)
  {ns}:engines       set of engine ids
  {ns}:rm:<engine>   sorted set key hex -> unix time the engine last removed the block (a removed
                     row that took it off the engine), trimmed on each apply to the removal window
                     and to the newest ``removal_cap`` members (what miss reasons call ``evicted``)
  {ns}:live:2        set once the index holds the cluster's residency (gone after a restart
                     without persistence: the control plane then asks every engine for a snapshot).
                     Versioned with the layout: an index written by layout 1 (one ``{ns}:k:<key>``
                     hash per block, ``{ns}:live``) is not live for this one, so every engine resends
                     a snapshot after the upgrade; ``clear()`` removes the old keys.
A whole report is applied by one Lua script call (msgpack argument), so it is atomic and costs one
round trip however many deltas it carries. Keys travel as hex strings because Lua numbers are
doubles and would lose the low bits of a 64-bit key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import msgpack
import redis

from .residency_index import (
    BIT,
    MEDIA,
    REMOVAL_CAP,
    REMOVAL_WINDOW_S,
    TIER_RANK,
    Delta,
    EngineUsage,
    Holder,
    full_holders,
    longest_prefix,
    validate_medium,
)

PIPELINE_KEYS = 5000  # keys per pipelined round trip: bounded memory on both ends
_APPLY = r"""
local ns = KEYS[1]
local batch = cmsgpack.unpack(ARGV[1])
local now, window, cap = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local CHUNK = 1000  -- fields per multi-field call: far below Lua's unpack() limit
local kkey = ns .. ':k'
local changes = 0
-- HMGET a list of fields in chunks into a table field -> value (false when absent)
local function hmget(key, fields, into)
  for i = 1, #fields, CHUNK do
    local part = {unpack(fields, i, math.min(i + CHUNK - 1, #fields))}
    local vals = redis.call('HMGET', key, unpack(part))
    for j, f in ipairs(part) do into[f] = vals[j] end
  end
end
-- one command per CHUNK items: cmd key a1 b1 a2 b2 ... (flat list of arguments)
local function chunked(cmd, key, flat, per)
  local step = CHUNK * per
  for i = 1, #flat, step do
    redis.call(cmd, key, unpack(flat, i, math.min(i + step - 1, #flat)))
  end
end
-- A holders value "e:m,e:m" with engine's mask set to m (0 removes it); '' when none is left.
local function put(v, engine, m)
  if not v or v == '' then
    if m == 0 then return '' end
    return engine .. ':' .. m
  end
  local out = {}
  for e, mm in string.gmatch(v, '([^:,]+):(%d+)') do
    if e ~= engine then out[#out + 1] = e .. ':' .. mm end
  end
  if m ~= 0 then out[#out + 1] = engine .. ':' .. m end
  return table.concat(out, ',')
end
-- Write each key's holders for engine: masks[k] (0 = no longer held), in chunked calls.
local function write_holders(engine, keys, masks)
  local vals = {}
  hmget(kkey, keys, vals)
  local set, gone = {}, {}
  for _, k in ipairs(keys) do
    local nv = put(vals[k], engine, masks[k])
    if nv == '' then
      if vals[k] then gone[#gone + 1] = k end
    else
      set[#set + 1] = k; set[#set + 1] = nv
    end
  end
  chunked('HSET', kkey, set, 2)
  chunked('HDEL', kkey, gone, 1)
  chunked('HDEL', ns .. ':p', gone, 1)  -- nobody holds it: its parent goes with it
end
local function drop(engine)
  local ekey = ns .. ':e:' .. engine
  local held = redis.call('HKEYS', ekey)
  local zero = {}
  for _, k in ipairs(held) do zero[k] = 0 end
  write_holders(engine, held, zero)
  redis.call('DEL', ekey)
  redis.call('SREM', ns .. ':engines', engine)
end
for _, d in ipairs(batch) do
  local engine = tostring(d[1])
  if d[2] == 1 then drop(engine) end
  local ekey = ns .. ':e:' .. engine
  local stored, removed = d[3], d[4]
  if #stored > 0 then redis.call('SADD', ns .. ':engines', engine) end
  -- Read every touched key's mask once, work in memory, write each key's final state once.
  local fields, seen = {}, {}
  for _, s in ipairs(stored) do
    if not seen[s[1]] then seen[s[1]] = true; fields[#fields + 1] = s[1] end
  end
  for _, r in ipairs(removed) do
    if not seen[r[1]] then seen[r[1]] = true; fields[#fields + 1] = r[1] end
  end
  local cur, orig = {}, {}
  hmget(ekey, fields, orig)
  for _, k in ipairs(fields) do orig[k] = tonumber(orig[k] or '0'); cur[k] = orig[k] end
  local parents, roots = {}, {}
  for _, s in ipairs(stored) do
    local k, parent = s[1], s[2]
    cur[k] = bit.bor(cur[k], s[3])
    if parent ~= '' then parents[#parents + 1] = k; parents[#parents + 1] = parent
    else roots[#roots + 1] = k end
    changes = changes + 1
  end
  for _, r in ipairs(removed) do
    local k, mb = r[1], r[2]
    if bit.band(cur[k], mb) ~= 0 then
      cur[k] = bit.band(cur[k], bit.bnot(mb))
      changes = changes + 1
    end
  end
  local set, gone, touched, left, passed = {}, {}, {}, {}, {}
  for _, k in ipairs(fields) do
    if cur[k] == 0 and orig[k] == 0 then passed[#passed + 1] = k end  -- e.g. stored, then removed
    if cur[k] ~= orig[k] then  -- unchanged (e.g. removing what it never held): nothing to write
      touched[#touched + 1] = k
      if cur[k] ~= 0 then set[#set + 1] = k; set[#set + 1] = cur[k]
      else
        gone[#gone + 1] = k
        if orig[k] ~= 0 then left[#left + 1] = now; left[#left + 1] = k end
      end
    end
  end
  -- Parents first: a key stored and removed in one delta leaves with its parent (below).
  chunked('HSET', ns .. ':p', parents, 2)
  if #roots > 0 then  -- a root key is recorded once, never over a known parent (HSETNX)
    local known = {}
    hmget(ns .. ':p', roots, known)
    local fresh, added = {}, {}
    for _, k in ipairs(roots) do
      if not known[k] and not added[k] then added[k] = true; fresh[#fresh + 1] = k; fresh[#fresh + 1] = '' end
    end
    chunked('HSET', ns .. ':p', fresh, 2)
  end
  write_holders(engine, touched, cur)
  if #passed > 0 then  -- not held here before or after: its parent stays only if another holds it
    local held, unheld = {}, {}
    hmget(kkey, passed, held)
    for _, k in ipairs(passed) do
      if not held[k] then unheld[#unheld + 1] = k end
    end
    chunked('HDEL', ns .. ':p', unheld, 1)
  end
  chunked('HSET', ekey, set, 2)
  chunked('HDEL', ekey, gone, 1)
  if #left > 0 then  -- blocks that left the engine: kept for the removal window, at most cap
    local rkey = ns .. ':rm:' .. engine
    chunked('ZADD', rkey, left, 2)
    redis.call('ZREMRANGEBYSCORE', rkey, '-inf', '(' .. (tonumber(now) - window))
    redis.call('ZREMRANGEBYRANK', rkey, 0, -(cap + 1))
  end
end
return changes
"""


def _holders(raw: bytes | str | None) -> dict[int, str]:
    """Engine -> fastest medium from a ``{ns}:k`` value ("engine:mask,...")."""
    if not raw:
        return {}
    if isinstance(raw, str):  # a client made with decode_responses=True
        raw = raw.encode()
    out = {}
    for item in raw.split(b","):
        engine, _, mask = item.partition(b":")
        if int(mask):
            out[int(engine)] = _fastest(int(mask))
    return out


def _fastest(mask: int) -> str:
    for medium in MEDIA:
        if mask & BIT[medium]:
            return medium
    raise ValueError(f"empty media mask {mask}")


class RedisResidencyIndex:
    """Residency index shared through Redis (see module docstring for the layout)."""

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        namespace: str = "pw",
        removal_window_s: float = REMOVAL_WINDOW_S,
        removal_cap: int = REMOVAL_CAP,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.r = (
            redis.Redis.from_url(url_or_client) if isinstance(url_or_client, str) else url_or_client
        )
        self.ns = "{" + namespace + "}"
        self._apply = self.r.register_script(_APPLY)
        self.removal_window_s, self.removal_cap, self.clock = removal_window_s, removal_cap, clock

    def _run(self, batch: list) -> int:
        args = [msgpack.packb(batch), repr(self.clock()), self.removal_window_s, self.removal_cap]
        return int(self._apply(keys=[self.ns], args=args))

    def apply(self, deltas: Iterable[Delta]) -> int:
        batch = []
        for d in deltas:
            # Each distinct medium checked once, not once per key; raises naming a bad one.
            for medium in {m for _, _, m in d.stored} | {m for _, m in d.removed}:
                validate_medium(medium)
            # %-formatting: ~1/3 faster than f-strings for 5,000 keys a report.
            stored = [
                ["%016x" % k, "" if p is None else "%016x" % p, BIT[m]]  # noqa: UP031
                for k, p, m in d.stored
            ]
            removed = [["%016x" % k, BIT[m]] for k, m in d.removed]  # noqa: UP031
            batch.append([d.engine, 1 if (d.snapshot or d.cleared) else 0, stored, removed])
        if not batch:
            return 0
        return self._run(batch)

    def engines_of(self, key: int) -> dict[int, str]:
        return _holders(self.r.hget(f"{self.ns}:k", f"{key:016x}"))

    def _engines_of_many(self, keys: Iterable[int]) -> dict[int, dict[int, str]]:
        """engines_of for many distinct keys: HMGET of PIPELINE_KEYS fields per round trip."""
        keys = list(dict.fromkeys(keys))
        table: dict[int, dict[int, str]] = {}
        kkey = f"{self.ns}:k"
        for i in range(0, len(keys), PIPELINE_KEYS):
            part = keys[i : i + PIPELINE_KEYS]
            values = self.r.hmget(kkey, ["%016x" % k for k in part])  # noqa: UP031
            for key, raw in zip(part, values, strict=True):
                table[key] = _holders(raw)
        return table

    def holders(self, keys: Sequence[int], limit: int = 16) -> list[Holder]:
        # One pipelined round trip for the whole chain, then the same walk as in-process.
        return longest_prefix(keys, self._engines_of_many(keys).__getitem__, limit)

    def holders_many(self, chains: Sequence[Sequence[int]], limit: int = 16) -> list[list[Holder]]:
        # Shared leading blocks are fetched once; 100k chains cost len(keys) / PIPELINE_KEYS trips.
        table = self._engines_of_many(k for chain in chains for k in chain)
        return [longest_prefix(chain, table.__getitem__, limit) for chain in chains]

    def full_holders_many(
        self, chains: Sequence[Sequence[int]], limit: int = 16
    ) -> list[list[Holder]]:
        table = self._engines_of_many(k for chain in chains for k in chain)
        return [full_holders(chain, table.get, TIER_RANK, limit) for chain in chains]

    def usage(self, engine: int) -> EngineUsage:
        counts: dict[str, int] = {}
        for mask in self.r.hvals(f"{self.ns}:e:{engine}"):
            for medium in MEDIA:
                if int(mask) & BIT[medium]:
                    counts[medium] = counts.get(medium, 0) + 1
        return EngineUsage(counts)

    def engines(self) -> list[int]:
        return sorted(
            int(e)
            for e in self.r.smembers(f"{self.ns}:engines")
            if self.r.exists(f"{self.ns}:e:{int(e)}")
        )

    def blocks_of(self, engine: int) -> dict[int, str]:
        raw = self.r.hgetall(f"{self.ns}:e:{engine}")
        return {int(k, 16): _fastest(int(m)) for k, m in raw.items() if int(m)}

    def parent_of(self, key: int) -> int | None:
        raw = self.r.hget(f"{self.ns}:p", f"{key:016x}")
        return int(raw, 16) if raw else None

    def drop_engine(self, engine: int) -> None:
        self._run([[engine, 1, [], []]])

    def removed_at_many(self, pairs: Sequence[tuple[int, int]]) -> list[float | None]:
        by_engine: dict[int, list[int]] = {}
        for engine, key in pairs:
            by_engine.setdefault(engine, []).append(key)
        engines = list(by_engine)
        pipe = self.r.pipeline(transaction=False)
        for engine in engines:
            pipe.zmscore(f"{self.ns}:rm:{engine}", ["%016x" % k for k in by_engine[engine]])  # noqa: UP031
        found: dict[tuple[int, int], float] = {}
        for engine, scores in zip(engines, pipe.execute(), strict=True):
            for key, at in zip(by_engine[engine], scores, strict=True):
                if at is not None:
                    found[(engine, key)] = float(at)
        oldest = self.clock() - self.removal_window_s
        return [
            at if (at := found.get(pair)) is not None and at >= oldest else None for pair in pairs
        ]

    def mark_live(self) -> bool:
        return bool(self.r.set(f"{self.ns}:live:2", 1, nx=True))

    def clear(self) -> None:
        cursor = 0
        while True:
            cursor, found = self.r.scan(cursor, match=f"{self.ns}:*", count=1000)
            if found:
                self.r.delete(*found)
            if cursor == 0:
                break
