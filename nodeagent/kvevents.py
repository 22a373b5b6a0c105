"""Decoding of vLLM's KV-cache event messages (ZMQ publisher wire format).

A message is three frames: topic, an 8-byte big-endian sequence number and a msgpack payload.
The payload is an ``EventBatch`` ``[ts, events, data_parallel_rank?]``. Each event is a tagged
union whose tag is the class name, encoded either as a positional array (older releases:
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium?,
lora_name?, ...]``) or as a map with a ``"type"`` key (newer releases). Both are accepted.

Events decode into ``msgspec.Struct``s that mirror vLLM's own (``vllm.distributed.kv_events``:
tagged by class name, every field kept, defaults where an older release sends fewer), so what
makes two blocks differ (LoRA adapter, multimodal inputs and cache salt in ``extra_keys``, the
KV-cache group ``group_idx`` of hybrid models, the medium) reaches the residency code. SGLang's
publisher (``sglang.srt.disaggregation.kv_events``, 0.5.23) sends the same classes as maps, with
the cache salt in a field of its own (``cache_salt``) and media named ``CPU_PINNED``,
``DISK``, ``EXTERNAL``; ``TIER_OF`` maps every engine's media names to Prewarm's tiers.
"""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec

from wire import protocol
from wire.blockhash import extra_for

STORED = "BlockStored"
REMOVED = "BlockRemoved"
CLEARED = "AllBlocksCleared"
DEFAULT_MEDIUM = protocol.TIER_GPU
_MASK64 = (1 << 64) - 1


# The media names engines publish -> Prewarm's tiers (vLLM: GPU, CPU, STORAGE; SGLang: GPU,
# CPU_PINNED, DISK, EXTERNAL: a shared remote pool, the slowest tier there is).
# vLLM's GPU and CPU and SGLang's DISK are spelled as Prewarm's tiers are.
TIER_OF = {
    protocol.TIER_GPU: protocol.TIER_GPU,
    protocol.TIER_CPU: protocol.TIER_CPU,
    "CPU_PINNED": protocol.TIER_CPU,
    "STORAGE": protocol.TIER_DISK,
    protocol.TIER_DISK: protocol.TIER_DISK,
    "EXTERNAL": protocol.TIER_DISK,
}


class EventDecodeError(ValueError):
    """A payload that is not a vLLM EventBatch."""


def decode_seq(frame: bytes) -> int:
    """The sequence number frame: 8 bytes, big-endian, signed (-1 ends a replay)."""
    if len(frame) != 8:
        raise EventDecodeError(f"sequence frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def decode_payload(payload: bytes) -> tuple[float, list[Any], int | None]:
    """Unpack an EventBatch payload into ``(ts, raw_events, data_parallel_rank)``."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise EventDecodeError(f"payload is not msgpack: {exc}") from None
    if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], list):
        raise EventDecodeError("payload is not an EventBatch [ts, events, dp_rank?]")
    rank = batch[2] if len(batch) > 2 else None
    return batch[0], batch[1], rank


def engine_hash(value: Any) -> int:
    """An engine block hash as an int (newer vLLM may publish bytes)."""
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value[-8:], "big") & _MASK64
    raise EventDecodeError(f"block hash must be int or bytes, got {type(value).__name__}")


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the events (vLLM's ``KVCacheEvent``)."""


class BlockStored(KVCacheEvent):
    """Blocks newly stored: ``block_size`` tokens of ``token_ids`` each, chained from
    ``parent_block_hash`` (None: the first block of a prompt)."""

    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int] | None
    block_size: int | None
    lora_id: int | None = None
    medium: str = DEFAULT_MEDIUM
    lora_name: str | None = None
    # Per block, untagged as vLLM publishes them: the LoRA name (when lora_name is set),
    # (mm_identifier, offset) pairs, the cache salt (first block of a prompt only), prompt-embeds
    # digests.
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    # SGLang's publisher names the salt here (every block of the event) instead of in extra_keys.
    cache_salt: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[Any]
    medium: str = DEFAULT_MEDIUM
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


def _checked(event: Event) -> Event:
    """Shape checks (O(1) per event) so residency code meets only the types it expects."""
    if type(event) is AllBlocksCleared:
        return event
    tag = type(event).__name__
    if not isinstance(event.block_hashes, list):  # type: ignore[union-attr]
        raise EventDecodeError(f"{tag}: block_hashes is not an array")
    if not isinstance(event.medium, str):  # type: ignore[union-attr]
        raise EventDecodeError(f"{tag}: medium is not a string")
    group = event.group_idx  # type: ignore[union-attr]
    if group is not None and (type(group) is not int or group < 0):
        raise EventDecodeError(f"{tag}: group_idx is not a non-negative integer")
    if type(event) is BlockStored:
        parent, token_ids, block_size = event.parent_block_hash, event.token_ids, event.block_size
        if parent is not None and not isinstance(parent, int | bytes):
            raise EventDecodeError("BlockStored: parent_block_hash is not an int or bytes")
        if token_ids is not None and not isinstance(token_ids, list):
            raise EventDecodeError("BlockStored: token_ids is not an array")
        if block_size is not None and (type(block_size) is not int or block_size <= 0):
            raise EventDecodeError("BlockStored: block_size is not a positive integer")
        if event.lora_name is not None and not isinstance(event.lora_name, str):
            raise EventDecodeError("BlockStored: lora_name is not a string")
        extra = event.extra_keys
        if extra is not None and (
            not isinstance(extra, list)
            or len(extra) != len(event.block_hashes)
            or not all(k is None or isinstance(k, list | tuple) for k in extra)
        ):
            raise EventDecodeError("BlockStored: extra_keys is not one array (or nil) per block")
    return event


def normalise(event: Any) -> Event:
    """One raw event (either encoding) as its struct (see module docstring)."""
    return _checked(_normalise(event))


_CLASSES: dict[str, tuple[type[BlockStored] | type[BlockRemoved], int]] = {
    STORED: (BlockStored, 4),  # class, fields an event must give (positionally)
    REMOVED: (BlockRemoved, 1),
}


def _normalise(event: Any) -> Event:
    fields: Any
    if type(event) is dict and event.get("type") == STORED:  # the hot path, spelled out
        get = event.get
        return BlockStored(
            get("block_hashes") or [],
            get("parent_block_hash"),
            get("token_ids"),
            get("block_size"),
            get("lora_id"),
            get("medium") or DEFAULT_MEDIUM,
            get("lora_name"),
            get("extra_keys"),
            get("group_idx"),
            get("kv_cache_spec_kind"),
            get("kv_cache_spec_sliding_window"),
            get("locality"),
            get("ownership"),
            get("session_id"),
            get("cache_salt"),
        )
    if isinstance(event, dict):
        tag, fields = event.get("type"), event
    elif isinstance(event, list | tuple) and event:
        tag, fields = event[0], event[1:]
    else:
        raise EventDecodeError(f"event is neither a map nor a tagged array: {type(event).__name__}")
    if tag == CLEARED:
        return AllBlocksCleared()
    if not isinstance(tag, str) or tag not in _CLASSES:
        raise EventDecodeError(f"unknown event type {tag!r}")
    cls: Any
    cls, required = _CLASSES[tag]  # fields unchecked here: _checked looks at them next
    names = cls.__struct_fields__
    if isinstance(fields, dict):
        try:  # the common case: every field is one the struct knows
            got = cls(**{k: v for k, v in fields.items() if k != "type"})
        except TypeError:  # a field it does not know (a newer release) or one absent (older)
            got = cls(
                **{k: fields.get(k) for k in names[:required]},
                **{k: fields[k] for k in names[required:] if k in fields},
            )
    else:
        if not required <= len(fields) <= len(names):
            raise EventDecodeError(f"positional {tag} has {len(fields)} fields")
        got = cls(*fields)
    if got.block_hashes is None:
        got.block_hashes = []
    if got.medium is None:
        got.medium = DEFAULT_MEDIUM
    return got


def block_extra(event: BlockStored, i: int) -> bytes:
    """The canonical ``extra`` of the event's block ``i`` (``blockhash.extra_for``) from what
    vLLM published: its ``extra_keys`` entry, else the LoRA name alone (older releases), and its
    KV-cache group."""
    keys = event.extra_keys[i] if event.extra_keys else None
    lora = event.lora_name
    group = event.group_idx or 0
    first_of_prompt = i == 0 and event.parent_block_hash is None
    if not keys:
        salt_ = event.cache_salt if first_of_prompt else None
        return extra_for(lora, cache_salt=salt_, group_idx=group)
    parts = list(keys)
    if lora and parts and parts[0] == lora:
        parts = parts[1:]
    mm: list[str] = []
    salt = None
    embeds: list[str] = []
    for p in parts:
        if isinstance(p, list | tuple) and len(p) == 2:
            mm.append(f"{p[0]}@{p[1]}")
        elif isinstance(p, str) and first_of_prompt and salt is None and not embeds:
            salt = p  # vLLM salts the first block of a prompt only
        elif isinstance(p, bytes | bytearray):
            embeds.append(p.hex())
        else:
            embeds.append(str(p))
    return extra_for(lora, mm, salt, group, embeds)
