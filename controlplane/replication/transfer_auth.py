"""The per-job transfer secret both agents of a job get in ``job.assign`` (docs/agent-protocol.md).

Derived, not stored: an HMAC of the job id and attempt under a key derived from SECRET_KEY, so
every web and worker process computes the same value, a redelivered assignment carries the same
secret, and a retry (attempt + 1) gets a new one. The source proves it holds the secret by an HMAC
over its transfer header (``nodeagent/transfers/auth.py``); the target refuses anything else.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac


def transfer_secret(job) -> str:
    """64 hex characters, the same for one job attempt in every process."""
    return salted_hmac("prewarm.replication.transfer", f"{job.pk}:{job.attempt}",
                       algorithm="sha256").hexdigest()
