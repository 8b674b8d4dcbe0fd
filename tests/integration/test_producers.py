"""producers.publish / apublish write in the caller's transaction only."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import producers
from relay.config import TableName
from relay.errors import ConfigError
from relay.store.migrate import migrate


def count(url: str, table: str = "outbox") -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert row is not None
        return int(row[0])


def test_publish_commits_with_the_business_transaction(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        key = producers.publish(conn, "orders", {"id": 1}, key="o-1", headers={"h": "v"}, priority=5)
        assert count(database_url) == 0, "publish must not commit by itself"
        conn.commit()
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT topic, key, payload, headers, priority FROM outbox WHERE idempotency_key = %s", [key]
        ).fetchone()
    assert row == ("orders", "o-1", {"id": 1}, {"h": "v"}, 5)


def test_rolled_back_transaction_leaves_nothing(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "orders", {"id": 1})
        conn.rollback()
    assert count(database_url) == 0


def test_same_idempotency_key_twice_writes_once_and_returns_the_key(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert producers.publish(conn, "t", {"v": 1}, idempotency_key="dup") == "dup"
        conn.commit()
        assert producers.publish(conn, "t", {"v": 2}, idempotency_key="dup") == "dup"
        conn.commit()
        row = conn.execute("SELECT payload FROM outbox").fetchall()
    assert row == [({"v": 1},)]


def test_apublish_and_a_schema_qualified_table(database_url: str) -> None:
    migrate(database_url, TableName.parse("events.outbox"))
    deliver_at = datetime.now(UTC) + timedelta(minutes=5)

    async def write() -> str:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            key = await producers.apublish(conn, "t", [1, 2], table="events.outbox", deliver_at=deliver_at)
            await conn.commit()
            return key

    key = asyncio.run(write())
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT payload, deliver_at FROM events.outbox WHERE idempotency_key = %s", [key]).fetchone()
    assert row == ([1, 2], deliver_at)
    assert count(database_url) == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"topic": ""}, ValueError),
        ({"headers": {"a": 1}}, TypeError),
        ({"key": 5}, TypeError),
        ({"deliver_at": datetime(2030, 1, 1)}, ValueError),
        ({"table": 'outbox"; drop table outbox;--'}, ConfigError),
    ],
)
def test_bad_arguments_are_refused_before_any_sql(database_url: str, kwargs: dict[str, object], error: type) -> None:
    args: dict[str, object] = {"topic": "t", **kwargs}
    topic = args.pop("topic")
    with psycopg.connect(database_url) as conn:
        with pytest.raises(error):
            producers.publish(conn, topic, {}, **args)  # type: ignore[arg-type]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert count(database_url) == 0
