"""Residency index in Redis, shared by every web and worker process in production.

Layout (all under one hash tag so a Redis Cluster keeps them in one slot and scripts stay atomic):
  {ns}:k:<key hex>   hash engine -> media bitmask (GPU=1, CPU=2, DISK=4)
  {ns}:e:<engine>    hash key hex -> media bitmask
  {ns}:p             hash key hex -> parent key hex
  {ns}:engines       set of engine ids
  {ns}:live          set once the index holds the cluster's residency (gone after a restart
                     without persistence: the control plane then asks every engine for a snapshot)
A whole report is applied by one Lua script call (msgpack argument), so it is atomic and costs one
round trip however many deltas it carries. Keys travel as hex strings because Lua numbers are
doubles and would lose the low bits of a 64-bit key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgpack
import redis

from .residency import (
    BIT,
    MEDIA,
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
local CHUNK = 1000  -- fields per multi-field call: far below Lua's unpack() limit
local changes = 0
local function drop(engine)
  local ekey = ns .. ':e:' .. engine
  local held = redis.call('HKEYS', ekey)
  for _, k in ipairs(held) do redis.call('HDEL', ns .. ':k:' .. k, engine) end
  redis.call('DEL', ekey)
  redis.call('SREM', ns .. ':engines', engine)
end
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
  local set, gone = {}, {}
  for _, k in ipairs(fields) do
    if cur[k] == orig[k] then  -- unchanged (e.g. removing what it never held): nothing to write
    elseif cur[k] ~= 0 then
      set[#set + 1] = k; set[#set + 1] = cur[k]
      redis.call('HSET', ns .. ':k:' .. k, engine, cur[k])
    else
      gone[#gone + 1] = k
      redis.call('HDEL', ns .. ':k:' .. k, engine)
    end
  end
  chunked('HSET', ekey, set, 2)
  chunked('HDEL', ekey, gone, 1)
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
end
return changes
"""


def _fastest(mask: int) -> str:
    for medium in MEDIA:
        if mask & BIT[medium]:
            return medium
    raise ValueError(f"empty media mask {mask}")


class RedisResidencyIndex:
    """Residency index shared through Redis (see module docstring for the layout)."""

    def __init__(self, url_or_client: str | redis.Redis, namespace: str = "pw") -> None:
        self.r = (
            redis.Redis.from_url(url_or_client) if isinstance(url_or_client, str) else url_or_client
        )
        self.ns = "{" + namespace + "}"
        self._apply = self.r.register_script(_APPLY)

    def apply(self, deltas: Iterable[Delta]) -> int:
        batch = []
        for d in deltas:
            # Each distinct medium checked once, not once per key; raises naming a bad one.
            for medium in {m for _, _, m in d.stored} | {m for _, m in d.removed}:
                validate_medium(medium)
            # %-formatting: ~1/3 faster than f-strings for 5,000 keys a report.
            stored = [["%016x" % k, "" if p is None else "%016x" % p, BIT[m]]  # noqa: UP031
                      for k, p, m in d.stored]
            removed = [["%016x" % k, BIT[m]] for k, m in d.removed]  # noqa: UP031
            batch.append([d.engine, 1 if (d.snapshot or d.cleared) else 0, stored, removed])
        if not batch:
            return 0
        return int(self._apply(keys=[self.ns], args=[msgpack.packb(batch)]))

    def engines_of(self, key: int) -> dict[int, str]:
        raw = self.r.hgetall(f"{self.ns}:k:{key:016x}")
        return {int(e): _fastest(int(m)) for e, m in raw.items() if int(m)}

    def _engines_of_many(self, keys: Iterable[int]) -> dict[int, dict[int, str]]:
        """engines_of for many distinct keys: pipelined, PIPELINE_KEYS per round trip."""
        keys = list(dict.fromkeys(keys))
        table: dict[int, dict[int, str]] = {}
        for i in range(0, len(keys), PIPELINE_KEYS):
            part = keys[i : i + PIPELINE_KEYS]
            pipe = self.r.pipeline(transaction=False)
            for key in part:
                pipe.hgetall(f"{self.ns}:k:{key:016x}")
            for key, row in zip(part, pipe.execute(), strict=True):
                table[key] = {int(e): _fastest(int(m)) for e, m in row.items() if int(m)}
        return table

    def holders(self, keys: Sequence[int], limit: int = 16) -> list[Holder]:
        # One pipelined round trip for the whole chain, then the same walk as in-process.
        return longest_prefix(keys, self._engines_of_many(keys).__getitem__, limit)

    def holders_many(self, chains: Sequence[Sequence[int]], limit: int = 16) -> list[list[Holder]]:
        # Shared leading blocks are fetched once; 100k chains cost len(keys) / PIPELINE_KEYS trips.
        table = self._engines_of_many(k for chain in chains for k in chain)
        return [longest_prefix(chain, table.__getitem__, limit) for chain in chains]

    def full_holders_many(self, chains: Sequence[Sequence[int]], limit: int = 16) -> list[list[Holder]]:
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
            int(e) for e in self.r.smembers(f"{self.ns}:engines") if self.r.exists(f"{self.ns}:e:{int(e)}")
        )

    def blocks_of(self, engine: int) -> dict[int, str]:
        raw = self.r.hgetall(f"{self.ns}:e:{engine}")
        return {int(k, 16): _fastest(int(m)) for k, m in raw.items() if int(m)}

    def parent_of(self, key: int) -> int | None:
        raw = self.r.hget(f"{self.ns}:p", f"{key:016x}")
        return int(raw, 16) if raw else None

    def drop_engine(self, engine: int) -> None:
        self._apply(keys=[self.ns], args=[msgpack.packb([[engine, 1, [], []]])])

    def mark_live(self) -> bool:
        return bool(self.r.set(f"{self.ns}:live", 1, nx=True))

    def clear(self) -> None:
        cursor = 0
        while True:
            cursor, found = self.r.scan(cursor, match=f"{self.ns}:*", count=1000)
            if found:
                self.r.delete(*found)
            if cursor == 0:
                break
