"""Django's SQLite backend with writers queued in this process and connections reused.

Writers. Every request of the embedded default is one transaction (``ATOMIC_REQUESTS``) and each
starts with ``BEGIN IMMEDIATE`` (``transaction_mode``), so concurrent requests, each on its own
thread under ASGI, wait for SQLite's write lock. SQLite's busy handler waits by sleeping 1, 2, 5,
... 100 ms and trying again, so the lock sat free while waiters slept: with 4 agents posting
reports back to back, 90 % of the view threads' time was spent in ``BEGIN IMMEDIATE`` (cProfile of
daphne, ``bench/ingest.py --profile``) and the 64-agent report p99 was seconds. Here a writer
first takes a per-process, per-database lock, released on commit, rollback or close, so the next
writer starts the moment the last one ends. Other processes (``manage.py``) still meet SQLite's
busy handler. A lock not had within the connection's ``timeout`` raises ``OperationalError``, as
SQLite's own "database is locked" would.

Connections. Django opens a connection per request (``CONN_MAX_AGE = 0``: under ASGI a request's
thread does not live on), which cost a connect, Django's set-up statements, a parse of the schema
on the first query and, when it was the last connection of a WAL database, a checkpoint on close:
~10 ms of a 200-delta report on a busy machine. Here a closed connection goes back to a
per-process pool (at most ``POOL_IDLE`` idle) and the next request takes it, rolled back and in
autocommit. sqlite3 connections may change threads (Django opens them with
``check_same_thread=False``); one is only ever used by the thread holding its Django wrapper.

In-memory databases (the test suite's) are left as Django has them.
"""

from __future__ import annotations

import sqlite3
import threading

from django.db import OperationalError
from django.db.backends.sqlite3 import base

POOL_IDLE = 16  # idle connections kept per database file

_locks: dict[str, threading.Lock] = {}
_idle: dict[str, list[sqlite3.Connection]] = {}
_guard = threading.Lock()


def _write_lock(name: str) -> threading.Lock:
    with _guard:
        return _locks.setdefault(name, threading.Lock())


def _idle_list(name: str) -> list[sqlite3.Connection]:
    with _guard:
        return _idle.setdefault(name, [])


class DatabaseWrapper(base.DatabaseWrapper):
    _held: threading.Lock | None = (
        None  # the write lock while this connection's transaction is open
    )

    def _name(self) -> str:
        return str(self.settings_dict["NAME"])

    def get_new_connection(self, conn_params):
        if not self.is_in_memory_db():
            idle = _idle_list(self._name())
            try:
                return idle.pop()  # list.pop is atomic: no two threads get the same one
            except IndexError:
                pass
        return super().get_new_connection(conn_params)

    def _start_transaction_under_autocommit(self):
        if self.is_in_memory_db():
            return super()._start_transaction_under_autocommit()
        lock = _write_lock(self._name())
        timeout = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        if not lock.acquire(timeout=timeout):
            raise OperationalError(f"database is locked (no write turn within {timeout:g} s)")
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            lock.release()
            raise
        self._held = lock

    def _release_write_lock(self) -> None:
        lock, self._held = self._held, None
        if lock is not None:
            lock.release()

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._release_write_lock()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release_write_lock()

    def _close(self):
        try:
            conn = self.connection
            if conn is None or self.is_in_memory_db() or self.in_atomic_block:
                return super()._close()
            try:
                if conn.in_transaction:
                    conn.rollback()
                conn.isolation_level = None  # autocommit, as Django's connect() leaves it
            except sqlite3.Error:
                return super()._close()
            idle = _idle_list(self._name())
            if len(idle) < POOL_IDLE:
                idle.append(conn)
            else:
                conn.close()
        finally:
            self._release_write_lock()
