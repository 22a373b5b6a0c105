"""One Redis connection pool per process for Django's cache (``OPTIONS["pool_class"]``).

Django builds a cache object, and with it a connection pool, per thread, and under ASGI every
request runs on a thread of its own: each request opened a new Redis connection for its rate-limit
check (redis-py's connect handshake, ~10 ms of a 1 Hz agent report on a busy machine, cProfile of
daphne under ``bench/ingest.py --profile``). Here every cache object of the process gets the same
pool for the same server and options; redis-py's pools are thread-safe and reset after a fork.
"""

from __future__ import annotations

import threading

import redis

_lock = threading.Lock()
_pools: dict[tuple, redis.ConnectionPool] = {}


class SharedConnectionPool(redis.ConnectionPool):
    @classmethod
    def from_url(cls, url: str, **kwargs):
        key = (url, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = super().from_url(url, **kwargs)
        return pool
