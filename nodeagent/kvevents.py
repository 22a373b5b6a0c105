"""Decoding of vLLM's KV-cache event messages (ZMQ publisher wire format).

A message is three frames: topic, an 8-byte big-endian sequence number and a msgpack payload.
The payload is an ``EventBatch`` ``[ts, events, data_parallel_rank?]``. Each event is a tagged
union whose tag is the class name, encoded either as a positional array (older releases:
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium?,
lora_name?]``) or as a map with a ``"type"`` key (newer releases). Both are accepted.

Events are normalised to small tuples so that residency code never looks at the encoding:

    (STORED, block_hashes, parent_hash, token_ids, block_size, lora_id, medium, lora_name)
    (REMOVED, block_hashes, medium)
    (CLEARED,)
"""

from __future__ import annotations

from typing import Any

import msgpack

from controlplane.core import protocol as wire

STORED = "BlockStored"
REMOVED = "BlockRemoved"
CLEARED = "AllBlocksCleared"
DEFAULT_MEDIUM = wire.TIER_GPU
_MASK64 = (1 << 64) - 1


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


def _checked(event: tuple) -> tuple:
    """Shape checks (O(1) per event) so residency code meets only the types it expects."""
    tag = event[0]
    if tag == CLEARED:
        return event
    if not isinstance(event[1], list):
        raise EventDecodeError(f"{tag}: block_hashes is not an array")
    medium = event[-1] if tag == REMOVED else event[6]
    if not isinstance(medium, str):
        raise EventDecodeError(f"{tag}: medium is not a string")
    if tag == STORED:
        _, _, parent, token_ids, block_size, _, _, lora_name = event
        if parent is not None and not isinstance(parent, int | bytes):
            raise EventDecodeError("BlockStored: parent_block_hash is not an int or bytes")
        if token_ids is not None and not isinstance(token_ids, list):
            raise EventDecodeError("BlockStored: token_ids is not an array")
        if block_size is not None and (type(block_size) is not int or block_size <= 0):
            raise EventDecodeError("BlockStored: block_size is not a positive integer")
        if lora_name is not None and not isinstance(lora_name, str):
            raise EventDecodeError("BlockStored: lora_name is not a string")
    return event


def normalise(event: Any) -> tuple:
    """One raw event (either encoding) as a normalised tuple (see module docstring)."""
    return _checked(_normalise(event))


def _normalise(event: Any) -> tuple:
    if isinstance(event, dict):
        tag = event.get("type")
        if tag == STORED:
            return (
                STORED,
                event.get("block_hashes") or [],
                event.get("parent_block_hash"),
                event.get("token_ids"),
                event.get("block_size"),
                event.get("lora_id"),
                event.get("medium") or DEFAULT_MEDIUM,
                event.get("lora_name"),
            )
        if tag == REMOVED:
            return (REMOVED, event.get("block_hashes") or [], event.get("medium") or DEFAULT_MEDIUM)
        if tag == CLEARED:
            return (CLEARED,)
        raise EventDecodeError(f"unknown event type {tag!r}")
    if isinstance(event, list | tuple) and event:
        tag = event[0]
        n = len(event)
        if tag == STORED:
            if n < 5:
                raise EventDecodeError("positional BlockStored has too few fields")
            return (
                STORED,
                event[1] or [],
                event[2],
                event[3],
                event[4],
                event[5] if n > 5 else None,
                (event[6] if n > 6 else None) or DEFAULT_MEDIUM,
                event[7] if n > 7 else None,
            )
        if tag == REMOVED:
            if n < 2:
                raise EventDecodeError("positional BlockRemoved has no block hashes")
            return (REMOVED, event[1] or [], (event[2] if n > 2 else None) or DEFAULT_MEDIUM)
        if tag == CLEARED:
            return (CLEARED,)
        raise EventDecodeError(f"unknown event tag {tag!r}")
    raise EventDecodeError(f"event is neither a map nor a tagged array: {type(event).__name__}")
