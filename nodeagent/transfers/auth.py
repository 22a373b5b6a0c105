"""Transfer authentication: the source proves it holds the job's secret.

The control plane gives both agents of a job the same per-job ``secret`` in ``job.assign``.
The source adds ``mac`` = HMAC-SHA256(secret, canonical header) to its transfer header; the header
carries the job id, attempt, keys, sizes and the transfer checksum, so a sender without the
secret can neither name the job nor vouch for bytes of its choice. The target recomputes and
compares in constant time before it reads a single block. The target proves the secret back
(``answer``: an HMAC of the source's mac) before the source sends a single block, so a host that
got itself in the target's place (the nccl rendezvous port is open on every interface) learns
nothing of the KV cache either.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

MAC_FIELD = "mac"


class AuthError(ValueError):
    """A transfer header that does not prove the job's secret."""


def _canonical(header: dict[str, Any]) -> bytes:
    body = {k: v for k, v in header.items() if k != MAC_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(secret: str, header: dict[str, Any]) -> str:
    if not secret:
        raise AuthError("the job carries no transfer secret (control plane older than the agent?)")
    return hmac.new(secret.encode(), _canonical(header), hashlib.sha256).hexdigest()


def verify(secret: str, header: dict[str, Any]) -> None:
    """Raise AuthError, saying why, unless ``header`` carries a valid MAC under ``secret``."""
    if not secret:
        raise AuthError("this agent has no transfer secret for the job")
    mac = header.get(MAC_FIELD)
    if not isinstance(mac, str) or not mac:
        raise AuthError("sender did not authenticate (no mac in its header)")
    if not hmac.compare_digest(mac, sign(secret, header)):
        raise AuthError("sender did not prove the job's secret (bad mac)")


def answer(secret: str, header: dict[str, Any]) -> str:
    """The target's proof, sent back on accepting ``header`` (already verified)."""
    mac = str(header.get(MAC_FIELD) or "")
    return hmac.new(secret.encode(), b"target:" + mac.encode(), hashlib.sha256).hexdigest()


def verify_answer(secret: str, header: dict[str, Any], got: Any) -> None:
    """Raise AuthError unless ``got`` is the target's proof for ``header``."""
    if not isinstance(got, str) or not hmac.compare_digest(got, answer(secret, header)):
        raise AuthError("the peer did not prove the job's secret: blocks not sent")
