"""Prewarm's canonical chained 64-bit hash of KV blocks.

vLLM's own block hashes depend on a per-process random seed, so they differ between engines and
restarts. Prewarm identifies a block by a hash of its content and of its parent instead. This
module is the whole definition: it uses only the standard library, so a gateway or router can
vendor it (or reimplement it from this docstring) and compute the same keys.

Definition (version 1):

    key(parent, tokens, extra) = little-endian uint64 of
        BLAKE2b(digest_size=8, person=b"prewarm-kv-v1")
            .update(parent as 8 bytes little-endian)
            .update(len(tokens) as 4 bytes little-endian)
            .update(each token id as 4 bytes little-endian)
            .update(len(extra) as 4 bytes little-endian)
            .update(extra)

The first block of a prompt has parent ``ROOT_PARENT`` (0). ``extra`` carries whatever makes
equal tokens produce different KV, as vLLM's own block hash does (its ``extra_keys``): a LoRA
adapter name, multimodal content hashes, a cache salt (vLLM salts the first block only; its
children inherit it through the chain), a KV-cache group other than 0 (hybrid models); see
``extra_for``. It is empty for plain text, so plain keys are the same as before any of these
existed. A prompt of N tokens with block size B has ``N // B`` full
blocks; a trailing partial block is never cached by vLLM and gets no key.

Keys travel as 16-digit lower-case hex strings in JSON (they exceed JavaScript's safe integers).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from hashlib import blake2b

ROOT_PARENT = 0
PERSON = b"prewarm-kv-v1"
KEY_BITS = 64
_MASK = (1 << KEY_BITS) - 1


def block_key(parent: int, tokens: Sequence[int], extra: bytes = b"") -> int:
    """Canonical key of one block given its parent's key, its token ids and extra keys."""
    n = len(tokens)
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS.setdefault(n, struct.Struct(f"<QI{n}II"))
    try:
        packed = packer.pack(parent, n, *tokens, len(extra))
    except struct.error as exc:
        if not 0 <= parent <= _MASK:
            raise ValueError(f"parent key out of range: {parent!r}") from None
        raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
    h = blake2b(packed, digest_size=8, person=PERSON)
    if extra:
        h.update(extra)
    return int.from_bytes(h.digest(), "little")


# One compiled struct per block length (block sizes are few: 16, 32, 512 ...).
_PACKERS: dict[int, struct.Struct] = {}


def chain_keys(
    token_ids: Sequence[int],
    block_size: int,
    extra: bytes = b"",
    parent: int = ROOT_PARENT,
    first_extra: bytes | None = None,
) -> list[int]:
    """Keys of every full block of ``token_ids``, chained from ``parent``; ``first_extra``, when
    given, replaces ``extra`` for the first block (a request's cache salt: ``request_keys``)."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    keys: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        x = first_extra if first_extra is not None and not keys else extra
        parent = block_key(parent, token_ids[start : start + block_size], x)
        keys.append(parent)
    return keys


def request_keys(
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """The keys of a text request's blocks as the engine's own events key them: the adapter on
    every block, the cache salt on the first (vLLM's ``extra_keys``)."""
    extra = extra_for(lora_name)
    first = extra_for(lora_name, cache_salt=cache_salt) if cache_salt else None
    return chain_keys(token_ids, block_size, extra, first_extra=first)


def extra_for(
    lora_name: str | None = None,
    mm_hashes: Iterable[str] = (),
    cache_salt: str | None = None,
    group_idx: int = 0,
    embeds: Iterable[str] = (),
) -> bytes:
    """The ``extra`` bytes of a block: its LoRA adapter, multimodal inputs, cache salt,
    prompt-embeds digests and KV-cache group (empty for plain text in group 0). Parts are
    ``lora:NAME``, ``mm:HASH`` (each, in order), ``salt:SALT``, ``embeds:DIGEST`` (each),
    ``group:N``, joined by U+001F."""
    parts = []
    if lora_name:
        parts.append("lora:" + lora_name)
    parts.extend("mm:" + h for h in mm_hashes)
    if cache_salt:
        parts.append("salt:" + cache_salt)
    parts.extend("embeds:" + e for e in embeds)
    if group_idx:
        parts.append(f"group:{group_idx}")
    return "\x1f".join(parts).encode()


def to_hex(key: int) -> str:
    """A key as the 16-digit hex string used in JSON."""
    return f"{key:016x}"


def from_hex(text: str) -> int:
    """Parse a key from its hex form; raises ValueError for anything else."""
    if not isinstance(text, str) or not 1 <= len(text) <= 16:
        raise ValueError(f"not a 64-bit hex key: {text!r}")
    try:
        return int(text, 16)
    except ValueError:
        raise ValueError(f"not a 64-bit hex key: {text!r}") from None


def engine_scoped_key(engine_id: str, engine_hash: int) -> int:
    """Fallback key for an engine block whose token ids are unknown (e.g. CPU-offload events).

    Only meaningful on that engine; the UI flags such blocks.
    """
    h = blake2b(digest_size=8, person=b"prewarm-eng-v1")
    h.update(engine_id.encode())
    h.update((engine_hash & _MASK).to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little")
