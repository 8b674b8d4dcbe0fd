"""``migrate`` behind an application's open transaction, on real PostgreSQL and MariaDB.

An upgrade's DDL waits for the table's lock, and every writer that comes after
queues behind that wait. The wait is short and tried again: the migration gives
up with the session that holds the table named, a writer's INSERT meanwhile
waits no longer than one short wait, and once the transaction ends the
migration goes through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from relay.config import TableName
from relay.store.lock_waits import LockWaitTimeout
from relay.store.migrate import migrate
from relay.store.mysql import migrate as mysql_migrate
from tests import mysql_support

TABLE = TableName.parse("outbox")
WAIT_SECONDS = 1.0
RETRY_SECONDS = 2.5
#: What a writer's INSERT may take on top of one wait, on a busy machine.
SLACK_SECONDS = 1.0


def while_migrating(migrating: Callable[[], list[int]], write: Callable[[], None]) -> tuple[BaseException, float]:
    """Run ``migrating`` in a thread, and ``write`` once it waits: the migration's error, the write's time."""
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            migrating()
        except BaseException as exc:  # noqa: BLE001 - asserted by the caller
            outcome.append(exc)

    thread = threading.Thread(target=attempt)
    thread.start()
    time.sleep(0.3)  # the migration's first DDL waits for the lock by now
    started = time.monotonic()
    write()
    took = time.monotonic() - started
    thread.join(RETRY_SECONDS + 30)
    assert not thread.is_alive()
    assert len(outcome) == 1, "the migration went through behind an open transaction"
    return outcome[0], took


def test_postgresql_migrate_gives_up_naming_the_open_transaction_and_never_holds_writers_up(
    empty_database: str,
) -> None:
    migrate(empty_database, TABLE)
    with psycopg.connect(empty_database, autocommit=True) as conn:  # back to version 4: one step to apply
        conn.execute("DROP TRIGGER outbox_writer_bounds ON outbox")
        conn.execute("DELETE FROM outbox_schema_version WHERE version = 5")
    with psycopg.connect(empty_database, application_name="orders-service") as holder:
        holder.execute("INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")  # open, holding the table

        def write() -> None:
            with psycopg.connect(empty_database) as writer:
                writer.execute("INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")

        error, took = while_migrating(
            lambda: migrate(empty_database, TABLE, lock_wait_seconds=WAIT_SECONDS, retry_seconds=RETRY_SECONDS),
            write,
        )
        assert isinstance(error, LockWaitTimeout)
        assert f"session {holder.info.backend_pid} " in str(error) and "orders-service" in str(error)
        assert took < WAIT_SECONDS + SLACK_SECONDS
        holder.commit()
    assert migrate(empty_database, TABLE, lock_wait_seconds=WAIT_SECONDS, retry_seconds=RETRY_SECONDS) == [5]


def test_postgresql_migrate_goes_through_once_the_transaction_ends_within_the_retries(empty_database: str) -> None:
    migrate(empty_database, TABLE)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("DROP TRIGGER outbox_writer_bounds ON outbox")
        conn.execute("DELETE FROM outbox_schema_version WHERE version = 5")
    holder = psycopg.connect(empty_database)
    holder.execute("INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")
    threading.Timer(1.5, holder.commit).start()  # after a wait or two ran out
    try:
        assert migrate(empty_database, TABLE, lock_wait_seconds=0.5, retry_seconds=20) == [5]
    finally:
        holder.close()


def test_mariadb_migrate_gives_up_naming_the_open_transaction_and_never_holds_writers_up(mysql_url: str) -> None:
    mysql_support.execute(mysql_url, "DROP TRIGGER outbox_writer_bounds")
    mysql_support.execute(mysql_url, "DELETE FROM outbox_schema_version WHERE version = 5")
    holder: Any = mysql_support.connect(mysql_url, autocommit=False)
    try:
        with holder.cursor() as cur:
            cur.execute(mysql_support.INSERT_EVENT, ("t", None, "{}", "held"))
            cur.execute("SELECT CONNECTION_ID()")
            (session,) = cur.fetchone()

        def write() -> None:
            mysql_support.execute(mysql_url, mysql_support.INSERT_EVENT, ("t", None, "{}", "meanwhile"))

        error, took = while_migrating(
            lambda: mysql_migrate.migrate(
                mysql_url, TABLE, lock_wait_seconds=WAIT_SECONDS, retry_seconds=RETRY_SECONDS
            ),
            write,
        )
        assert isinstance(error, LockWaitTimeout), error
        assert f"session {session} " in str(error)
        assert took < WAIT_SECONDS + SLACK_SECONDS
        holder.commit()
    finally:
        holder.close()
    assert mysql_migrate.migrate(mysql_url, TABLE, lock_wait_seconds=WAIT_SECONDS, retry_seconds=RETRY_SECONDS) == [5]
    assert mysql_support.execute(mysql_url, "SELECT COUNT(*) FROM outbox") == [(2,)]


def test_the_error_says_when_no_session_holds_the_table() -> None:
    assert "no session holds it now" in str(LockWaitTimeout(TABLE, 2.0, []))
