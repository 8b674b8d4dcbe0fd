"""requeue and replay over a selection larger than one statement may change within the statement timeout.

Two million dead letters in one UPDATE outlasted the timeout and requeued none (PostgreSQL and MariaDB).
Here the timeout is short and the selection a few tens of thousands: one statement over all of it is
stopped, and nothing changes; in batches, the whole selection goes through under the same timeout.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from relay.config import TableName
from relay.errors import StoreUnavailable
from relay.store.base import Admin, ReplayFilter, RequeueFilter
from relay.store.mysql import MySQLAdmin
from relay.store.postgres import PostgresAdmin
from tests import mysql_support

EVENTS = 30_000
#: Short enough that one statement over EVENTS rows outlasts it, long enough for a batch of BATCH.
TIMEOUT_SECONDS = 0.25
BATCH = 500  # a few tens of milliseconds a batch, several times less than the timeout

pytestmark = pytest.mark.timeout(120)


def _fill_postgres(url: str, state: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state, attempts, failed_at, published_at)"
            " SELECT 'orders', 'k' || (g %% 500), '{}', %s, 3,"
            " CASE WHEN %s = 'failed' THEN now() END, CASE WHEN %s = 'sent' THEN now() END"
            " FROM generate_series(1, %s) AS g",
            [state, state, state, EVENTS],
        )
        conn.execute("ANALYZE outbox")


def _fill_mysql(url: str, state: str) -> None:
    column = "failed_at" if state == "failed" else "published_at"
    conn = mysql_support.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION max_recursive_iterations = %s", [EVENTS])  # MariaDB's (MySQL 8: its depth)
            cur.execute(
                "INSERT INTO outbox (topic, `key`, payload, state, attempts, "
                + column
                + ") WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s)"
                " SELECT 'orders', CONCAT('k', n %% 500), '{}', %s, 3, UTC_TIMESTAMP(6) FROM g",
                [EVENTS, state],
            )
        conn.commit()
    finally:
        conn.close()


def _count(url: str, state: str, mysql: bool) -> int:
    query = "SELECT count(*) FROM outbox WHERE state = %s"
    if mysql:
        return int(mysql_support.execute(url, query, [state])[0][0])
    with psycopg.connect(url) as conn:
        row = conn.execute(query, [state]).fetchone()
        assert row is not None
        return int(row[0])


async def _requeue_or_replay(admin: Admin, command: str, batch_size: int, told: list[int]) -> list[int]:
    await admin.open()
    try:
        if command == "requeue":
            return await admin.requeue(RequeueFilter(all=True), batch_size=batch_size, progress=told.append)
        return await admin.replay(ReplayFilter(all=True), batch_size=batch_size, progress=told.append)
    finally:
        await admin.close()


# Requeue on both databases; replay takes the same path on each (a select, then one batch changed by
# id), its batches are checked on every store by the conformance tests, and 2,000,000 were timed by hand.
@pytest.mark.parametrize(("database", "command"), [("postgres", "requeue"), ("mysql", "requeue")])
def test_a_selection_one_statement_cannot_change_in_time_goes_through_in_batches(
    request: pytest.FixtureRequest, database: str, command: str
) -> None:
    mysql = database == "mysql"
    url = request.getfixturevalue("mysql_url" if mysql else "database_url")
    state = "failed" if command == "requeue" else "sent"
    (_fill_mysql if mysql else _fill_postgres)(url, state)

    def admin() -> Admin:
        table = TableName.parse("outbox")
        if mysql:
            return MySQLAdmin(url, table, statement_timeout=TIMEOUT_SECONDS)
        return PostgresAdmin(url, table, statement_timeout=TIMEOUT_SECONDS)

    # One batch of everything, as the command was: stopped at the timeout, and nothing changed.
    with pytest.raises(StoreUnavailable):
        asyncio.run(_requeue_or_replay(admin(), command, EVENTS, []))
    assert _count(url, state, mysql) == EVENTS
    told: list[int] = []
    changed = asyncio.run(_requeue_or_replay(admin(), command, BATCH, told))
    assert len(changed) == EVENTS and changed == sorted(changed)
    assert told == [BATCH] * (EVENTS // BATCH)  # each batch committed and told, under the same timeout
    assert _count(url, state, mysql) == 0
