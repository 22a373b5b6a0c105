"""The per-job transfer secret both agents of a job get in ``job.assign`` (docs/agent-protocol.md).

Derived, not stored: an HMAC of the job id under a key derived from SECRET_KEY, so every web and
worker process computes the same value and every delivery of the job carries the same secret. It
is per job, not per attempt: an agent still sending an earlier attempt when the retry arrives
(``nodeagent/jobs.py`` lets the running attempt finish) must still be able to deliver it, as
before. The source proves it holds the secret by an HMAC over its transfer header, which names the
attempt (``nodeagent/transfers/auth.py``); the target refuses anything else.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac


def transfer_secret(job) -> str:
    """64 hex characters, the same for one job in every process."""
    return salted_hmac("prewarm.replication.transfer", str(job.pk), algorithm="sha256").hexdigest()
