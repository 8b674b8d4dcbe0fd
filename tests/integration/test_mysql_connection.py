"""The MySQL store's connections on real MariaDB: lost connections, lock conflicts, the binlog check."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from relay.config import TableName
from relay.errors import StoreError, StoreUnavailable
from relay.store.mysql import MySQLStore
from relay.store.mysql.connection import LOCK_RETRIES
from tests import mysql_support


def store_for(url: str) -> MySQLStore:
    return MySQLStore(url, TableName.parse("outbox"), owner="t", lease_seconds=30)


def test_a_killed_connection_fails_one_call_and_the_next_reconnects(mysql_url: str) -> None:
    async def scenario() -> None:
        store = store_for(mysql_url)
        await store.open()
        try:
            [[thread]] = await store._db.call("main", _rows("SELECT CONNECTION_ID()"))
            mysql_support.execute(mysql_url, f"KILL CONNECTION {int(thread)}")
            with pytest.raises(StoreUnavailable):
                await store.claim(10, max_attempts=3)
            mysql_support.execute(mysql_url, "INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")
            assert len((await store.claim(10, max_attempts=3)).events) == 1
        finally:
            await store.close()

    asyncio.run(scenario())


def _rows(statement: str) -> Any:
    async def work(cur: Any) -> Any:
        await cur.execute(statement)
        return await cur.fetchall()

    return work


def test_deadlocks_are_tried_again_then_reported_as_unavailable(
    mysql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    async def deadlocked(cur: Any) -> int:
        nonlocal calls
        calls += 1
        if calls <= failures:
            await cur.execute("SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'deadlock'")
        await cur.execute("SELECT 1")
        return int((await cur.fetchone())[0])

    async def scenario() -> int:
        store = store_for(mysql_url)
        await store.open()
        try:
            return await store._db.call("main", deadlocked)
        finally:
            await store.close()

    failures = 2
    with caplog.at_level(logging.INFO):
        assert asyncio.run(scenario()) == 1
    assert calls == 3
    assert [r.action for r in caplog.records if hasattr(r, "action")].count("lock_retry") == 2
    calls, failures = 0, 100
    with pytest.raises(StoreUnavailable, match="deadlock"):
        asyncio.run(scenario())
    assert calls == LOCK_RETRIES + 1


def test_other_errors_are_store_errors_and_not_retried(mysql_url: str) -> None:
    async def scenario() -> None:
        store = store_for(mysql_url)
        await store.open()
        try:
            await store._db.call("main", _rows("SELECT no_such_column FROM outbox"))
        finally:
            await store.close()

    with pytest.raises(StoreError, match="not an outbox table"):
        asyncio.run(scenario())


def test_relay_sessions_run_at_read_committed_in_utc(mysql_url: str) -> None:
    async def scenario() -> list[Any]:
        store = store_for(mysql_url)
        await store.open()
        try:
            # MariaDB 10.11 and MySQL 8 name the isolation and the timeout differently.
            isolation, timeout = (
                ("tx_isolation", "max_statement_time")
                if store._db.mariadb
                else ("transaction_isolation", "max_execution_time / 1000")
            )
            query = f"SELECT @@session.{isolation}, @@session.time_zone, @@session.{timeout}, @@session.sql_mode"
            rows: list[Any] = await store._db.call("settle", _rows(query))
            return rows
        finally:
            await store.close()

    [(isolation, zone, timeout, sql_mode)] = asyncio.run(scenario())
    assert (isolation, zone, float(timeout)) == ("READ-COMMITTED", "+00:00", 30.0)
    # The dialect the queries are written in, whatever the server's default mode: no
    # NO_BACKSLASH_ESCAPES (bytes parameters are escaped with backslashes), no ANSI_QUOTES.
    assert set(sql_mode.split(",")) == {"STRICT_ALL_TABLES", "ERROR_FOR_DIVISION_BY_ZERO", "NO_ENGINE_SUBSTITUTION"}


def test_gauges_are_exact_under_the_bound_and_estimated_past_it(mysql_url: str) -> None:
    rows = [("t", f"k{i % 3}", "{}") for i in range(30)]
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", rows)
            cur.execute("ANALYZE TABLE outbox")
            cur.fetchall()
    finally:
        conn.close()

    async def scenario() -> tuple[Any, Any, Any]:
        store = store_for(mysql_url)
        await store.open()
        try:
            await store.claim(2, max_attempts=3)
            return await store.status(), await store.gauges(), await store.gauges(exact_up_to=10)
        finally:
            await store.close()

    exact, gauges, bounded = asyncio.run(scenario())
    assert (exact.pending, exact.in_flight) == (28, 2)
    assert (gauges.pending, gauges.in_flight, gauges.failed) == (28, 2, 0)
    # Past the bound: at least what it read, and InnoDB's row estimate beyond it.
    assert bounded.pending + bounded.in_flight >= 11
    assert bounded.in_flight <= 2


def test_concurrent_calls_on_one_store_each_read_their_own_results(mysql_url: str) -> None:
    # A relay settles the batches of its pipeline at once, on one connection:
    # interleaved on the wire, one settle once read another's row count.
    rows = [("t", None, "{}") for _ in range(400)]
    mysql_support.insert_many(mysql_url, "INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", rows)

    async def scenario() -> list[Any]:
        store = store_for(mysql_url)
        await store.open()
        try:
            claims = [await store.claim(size, max_attempts=3) for size in (150, 50, 120, 80)]
            settle = [store.settle(c, sent=[e.id for e in c.events], retry=[], dead=[]) for c in claims]
            return list(await asyncio.gather(*settle, store.status(), store.gauges()))
        finally:
            await store.close()

    *settled, status, gauges = asyncio.run(scenario())
    assert [(s.sent, s.lost) for s in settled] == [(150, 0), (50, 0), (120, 0), (80, 0)]
    assert status.failed == gauges.failed == 0


def test_a_very_long_error_is_cut_to_fit_last_error(mysql_url: str) -> None:
    from relay.store.base import Dead

    mysql_support.execute(mysql_url, "INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")

    async def scenario() -> Any:
        store = store_for(mysql_url)
        await store.open()
        try:
            claim = await store.claim(10, max_attempts=3)
            return await store.settle(claim, sent=[], retry=[], dead=[Dead(claim.events[0].id, "é" * 100_000)])
        finally:
            await store.close()

    assert asyncio.run(scenario()).dead == 1
    assert mysql_support.execute(mysql_url, "SELECT CHAR_LENGTH(last_error), state FROM outbox") == [(16000, "failed")]
