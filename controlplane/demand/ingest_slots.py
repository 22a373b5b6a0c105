"""How many request-record batches one web process parses at once.

A batch of up to ``PREWARM_MAX_RECORDS_PER_BATCH`` records is a few MiB of JSON that becomes
about a million Python objects while it is decoded, validated and rolled into buckets. Each
process parses at most ``PREWARM_INGEST_CONCURRENCY`` at a time; a batch that finds every slot
taken waits up to ``PREWARM_INGEST_WAIT_SECONDS`` for one, and is then answered 503 with
``Retry-After``, having changed nothing (agents and gateways keep a refused batch and send it
again). So what ingest holds at its peak is bounded by the slots, not by how many clients post
at once, and the allocator's high-water mark with it (memory freed after a peak mostly stays
with the process: experiments/demo-memory)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

_lock = threading.Lock()
_slots: dict[int, threading.BoundedSemaphore] = {}


def _semaphore() -> threading.BoundedSemaphore:
    n = max(1, int(settings.PREWARM_INGEST_CONCURRENCY))
    with _lock:
        return _slots.setdefault(n, threading.BoundedSemaphore(n))


class Busy(Exception):
    """Every slot stayed taken for the whole wait."""


@contextmanager
def slot() -> Iterator[None]:
    """Hold one of the process's ingest slots for the ``with`` block, or raise ``Busy``."""
    sem = _semaphore()
    if not sem.acquire(timeout=max(0.0, float(settings.PREWARM_INGEST_WAIT_SECONDS))):
        raise Busy
    try:
        yield
    finally:
        sem.release()
