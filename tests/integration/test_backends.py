"""The embedded SQLite backend (writers queued in-process, connections reused) and the shared
Redis pool of Django's cache (controlplane/backends/)."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError
from django.db.utils import ConnectionHandler

from controlplane.backends.redis_pool import SharedConnectionPool
from controlplane.backends.sqlite import base as sqlite_backend


@pytest.fixture
def databases(tmp_path, django_db_blocker):
    """A handler of connections to a SQLite file of this test (one connection per thread)."""

    def make(timeout: float = 5.0) -> ConnectionHandler:
        return ConnectionHandler(
            {
                "default": {
                    "ENGINE": "controlplane.backends.sqlite",
                    "NAME": str(tmp_path / "db.sqlite3"),
                    "OPTIONS": {
                        "timeout": timeout,
                        "transaction_mode": "IMMEDIATE",
                        "init_command": "PRAGMA journal_mode=WAL;",
                    },
                }
            }
        )

    with django_db_blocker.unblock():
        setup = make()["default"]
        with setup.cursor() as cur:
            cur.execute("CREATE TABLE t (v TEXT)")
        setup.close()
        yield make


def begin(conn) -> None:
    conn.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)


def end(conn, commit: bool) -> None:
    conn.commit() if commit else conn.rollback()
    conn.set_autocommit(True)


def in_thread(fn):
    """Run fn on a new thread (its own connections); returns what it returned or raises it."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the thread did not finish"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def rows(conn) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT v FROM t ORDER BY v")
        return [r[0] for r in cur.fetchall()]


@pytest.mark.parametrize("how", ["commit", "rollback", "close"])
def test_a_writer_turn_ends_with_its_transaction(databases, how):
    conn = databases()["default"]
    begin(conn)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO t VALUES ('first')")
    if how == "close":
        conn.close()
    else:
        end(conn, how == "commit")

    def second_writer():  # a turn left held would time out here (0.5 s), not wait for SQLite
        other = databases(timeout=0.5)["default"]
        begin(other)
        with other.cursor() as cur:
            cur.execute("INSERT INTO t VALUES ('second')")
        end(other, True)
        found = rows(other)
        other.close()
        return found

    expected = ["first", "second"] if how == "commit" else ["second"]
    assert in_thread(second_writer) == expected


def test_a_writer_without_a_turn_in_its_timeout_gets_database_is_locked(databases):
    holder = databases()["default"]
    begin(holder)

    def waiter():
        other = databases(timeout=0.3)["default"]
        begin(other)

    with pytest.raises(OperationalError, match="database is locked"):
        in_thread(waiter)
    end(holder, True)
    holder.close()


def test_a_closed_connection_is_reused_rolled_back_and_in_autocommit(databases):
    handler = databases()
    conn = handler["default"]
    begin(conn)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO t VALUES ('never committed')")
    raw = conn.connection
    conn.close()
    assert raw in sqlite_backend._idle[conn.settings_dict["NAME"]]
    again = databases()["default"]
    with again.cursor() as cur:
        cur.execute("SELECT 1")
    assert again.connection is raw and raw.isolation_level is None and not raw.in_transaction
    assert rows(again) == []
    again.close()


def test_in_memory_databases_take_no_turn_and_are_not_pooled(django_db_blocker):
    handler = ConnectionHandler(
        {"default": {"ENGINE": "controlplane.backends.sqlite", "NAME": ":memory:"}}
    )
    with django_db_blocker.unblock():
        conn = handler["default"]
        begin(conn)
        assert conn._held is None
        end(conn, True)
    assert ":memory:" not in sqlite_backend._locks and ":memory:" not in sqlite_backend._idle


def test_cache_clients_share_one_redis_pool_per_server_and_options():
    a = SharedConnectionPool.from_url("redis://127.0.0.1:6399/7", socket_timeout=2)
    assert SharedConnectionPool.from_url("redis://127.0.0.1:6399/7", socket_timeout=2) is a
    assert SharedConnectionPool.from_url("redis://127.0.0.1:6399/8", socket_timeout=2) is not a
    assert SharedConnectionPool.from_url("redis://127.0.0.1:6399/7", socket_timeout=3) is not a
