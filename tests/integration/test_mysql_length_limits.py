"""The length limits of topic, key, idempotency_key and content_type hold for writers in every sql_mode.

Without strict mode the server cuts an over-long value to its column's size
with only a warning. Had the limits been the columns' sizes, two long keys
would have become one key, a long topic another topic, and two long
idempotency keys one event (migration 0004: each column is one unit wider than
a CHECK allows, so a cut value is still refused).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pymysql
import pytest

from relay.config import TableName
from relay.store.mysql import MySQLStore
from relay.store.mysql.migrate import migrate, schema_version
from tests import mysql_support

#: A writer with the older defaults, and one in strict mode whatever the server's default is.
SQL_MODES = {"not strict": "", "strict": "STRICT_TRANS_TABLES"}

#: Per column: values at the limit (taken as they are) and past it (refused), by name.
#: topic counts characters (multi-byte ones too); `key` and idempotency_key bytes;
#: content_type bytes of UTF-8.
AT_LIMIT: dict[str, dict[str, Any]] = {
    "topic": {"249 ascii": "t" * 249, "249 two-byte": "\u00e9" * 249, "249 four-byte": "\U0001f600" * 249},
    "key": {"1024 bytes": b"k" * 1024, "512 two-byte": "\u00e9".encode() * 512, "1024 not utf-8": b"\xff" * 1024},
    "idempotency_key": {"800 bytes": b"i" * 800, "200 four-byte": "\U0001f600".encode() * 200},
    "content_type": {"255 ascii": "a" * 255, "255 bytes of two-byte": "\u00e9" * 127 + "c"},
}
PAST_LIMIT: dict[str, dict[str, Any]] = {
    "topic": {
        "250 ascii": "t" * 250,
        "250 two-byte": "\u00e9" * 250,
        "250 four-byte": "\U0001f600" * 250,
        "255 ascii": "t" * 255,
        "5000 two-byte": "\u00e9" * 5000,
    },
    "key": {
        "1025 bytes": b"k" * 1025,
        "513 two-byte": "\u00e9".encode() * 513,
        "1025 not utf-8": b"\xff" * 1025,
        "100000 bytes": b"k" * 100_000,
    },
    "idempotency_key": {
        "801 bytes": b"i" * 801,
        "201 four-byte": "\U0001f600".encode() * 201,
        "10000 bytes": b"i" * 10_000,
    },
    "content_type": {
        "256 ascii": "a" * 256,
        "128 two-byte (256 bytes)": "\u00e9" * 128,
        "1000 ascii": "a" * 1000,
    },
}

INSERT = (
    "INSERT INTO outbox (topic, `key`, payload, payload_bytes, content_type, idempotency_key)"
    " VALUES (%(topic)s, %(key)s, %(payload)s, %(payload_bytes)s, %(content_type)s, %(idempotency_key)s)"
)


def _row(column: str, value: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "topic": "t",
        "key": None,
        "payload": "{}",
        "payload_bytes": None,
        "content_type": None,
        "idempotency_key": uuid.uuid4().hex.encode(),
    }
    if column == "content_type":
        row.update(payload=None, payload_bytes=b"x")
    row[column] = value
    return row


def _outcome(url: str, mode: str, column: str, value: Any) -> str:
    """'taken' (stored exactly), 'cut' (stored otherwise) or 'refused', for ``value`` written in sql_mode ``mode``.

    A row written is deleted again, so that the next sql_mode may write the same idempotency key.
    """
    row = _row(column, value)
    conn = mysql_support.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = %s", [mode])
            try:
                cur.execute(INSERT, row)
            except pymysql.err.MySQLError as exc:
                # 1062 would read as "already written" to a plain-SQL writer: a lost event, not a refusal.
                return f"error {exc.args[0]}" if exc.args[0] == 1062 else "refused"
            cur.execute(f"SELECT {'`key`' if column == 'key' else column} FROM outbox WHERE id = LAST_INSERT_ID()")
            [(stored,)] = cur.fetchall()
            cur.execute("DELETE FROM outbox WHERE id = LAST_INSERT_ID()")  # the same value in the next sql_mode
    finally:
        conn.close()
    return "taken" if stored == value else "cut"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("column", list(AT_LIMIT))
def test_values_at_the_limit_are_taken_and_past_it_refused_in_every_sql_mode(mysql_url: str, column: str) -> None:
    outcomes = {
        (mode, name): _outcome(mysql_url, sql_mode, column, value)
        for mode, sql_mode in SQL_MODES.items()
        for cases in (AT_LIMIT[column], PAST_LIMIT[column])
        for name, value in cases.items()
    }
    expected = {(mode, name): "taken" for mode in SQL_MODES for name in AT_LIMIT[column]}
    expected |= {(mode, name): "refused" for mode in SQL_MODES for name in PAST_LIMIT[column]}
    assert outcomes == expected
    assert mysql_support.execute(mysql_url, "SELECT COUNT(*) FROM outbox") == [(0,)]


def test_two_distinct_long_idempotency_keys_are_refused_not_taken_for_one_event(mysql_url: str) -> None:
    """Cut to one value, the second's error 1062 told a plain-SQL writer "already written": its event was lost."""
    shared = b"i" * 800
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            for tail in (b"-first", b"-second"):
                with pytest.raises(pymysql.err.MySQLError) as refused:
                    cur.execute(
                        "INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('t', '{}', %s)", [shared + tail]
                    )
                assert refused.value.args[0] != 1062
    finally:
        conn.close()
    assert mysql_support.execute(mysql_url, "SELECT COUNT(*) FROM outbox") == [(0,)]


def test_migrate_upgrades_a_table_of_version_3_keeping_its_events_up_to_the_limits(mysql_empty_url: str) -> None:
    table = TableName.parse("outbox")
    assert mysql_support.migrate_up_to(mysql_empty_url, 3) == [1, 2, 3]
    topic, key, idem, content_type = "\U0001f600" * 249, b"k" * 1024, b"i" * 800, "a" * 255
    mysql_support.execute(
        mysql_empty_url,
        "INSERT INTO outbox (topic, `key`, payload, idempotency_key) VALUES (%s, %s, '{\"n\": 1}', %s)",
        [topic, key, idem],
    )
    mysql_support.execute(
        mysql_empty_url,
        "INSERT INTO outbox (topic, `key`, payload_bytes, content_type, idempotency_key)"
        " VALUES ('t', %s, X'00ff', %s, 'bytes')",
        [b"j" * 1024, content_type],
    )
    assert migrate(mysql_empty_url, table) == [4, 5, 6, 7]
    assert migrate(mysql_empty_url, table) == []
    assert schema_version(mysql_empty_url, table) == 7
    for column, value in (("topic", "t" * 250), ("key", b"k" * 1025), ("idempotency_key", b"i" * 801)):
        assert _outcome(mysql_empty_url, "", column, value) == "refused", column
    assert _outcome(mysql_empty_url, "", "content_type", "a" * 256) == "refused"
    store = MySQLStore(mysql_empty_url, table, owner="t", lease_seconds=30)

    async def claim() -> list[tuple[str, str | None, str, bytes, str | None]]:
        await store.open()
        try:
            claimed = (await store.claim(10, max_attempts=3)).events
            return [(e.topic, e.key, e.idempotency_key, e.payload, e.content_type) for e in claimed]
        finally:
            await store.close()

    assert asyncio.run(claim()) == [
        (topic, key.decode(), idem.decode(), b'{"n": 1}', None),
        ("t", "j" * 1024, "bytes", b"\x00\xff", content_type),
    ]
