"""producers.publish with PyMySQL and apublish with asyncmy write in the caller's transaction only."""

from __future__ import annotations

import asyncio
import json
import warnings
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncmy
import asyncmy.cursors
import pymysql.cursors
import pytest

import producers
from relay.config import TableName
from relay.errors import ConfigError
from relay.store.mysql import Target
from relay.store.mysql.migrate import migrate
from tests import mysql_support
from tests.integration.rabbit_support import temp_queue
from tests.producer_cases import BAD_ARGUMENTS
from tests.relay_support import RelayThread


def count(url: str, table: str = "outbox") -> int:
    return int(mysql_support.execute(url, f"SELECT COUNT(*) FROM {table}")[0][0])


def test_publish_commits_with_the_business_transaction(mysql_url: str) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        key = producers.publish(conn, "orders", {"id": 1}, key="o-1", headers={"h": "v"}, priority=5)
        assert count(mysql_url) == 0, "publish must not commit by itself"
        conn.commit()
    finally:
        conn.close()
    [(topic, event_key, payload, headers, priority)] = mysql_support.execute(
        mysql_url, "SELECT topic, `key`, payload, headers, priority FROM outbox WHERE idempotency_key = %s", [key]
    )
    assert (topic, event_key, json.loads(payload), json.loads(headers), priority) == (
        "orders",
        b"o-1",
        {"id": 1},
        {"h": "v"},
        5,
    )


def test_rolled_back_transaction_leaves_nothing(mysql_url: str) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        producers.publish(conn, "orders", {"id": 1})
        conn.rollback()
    finally:
        conn.close()
    assert count(mysql_url) == 0


def test_same_idempotency_key_twice_writes_once_and_returns_the_key(mysql_url: str) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        assert producers.publish(conn, "t", {"v": 1}, idempotency_key="dup") == "dup"
        conn.commit()
        assert producers.publish(conn, "t", {"v": 2}, idempotency_key="dup") == "dup"
        conn.commit()
    finally:
        conn.close()
    assert [json.loads(p) for (p,) in mysql_support.execute(mysql_url, "SELECT payload FROM outbox")] == [{"v": 1}]


#: Not UTF-8 (a lone continuation byte, an invalid two-byte sequence), with NUL and every other byte value.
NOT_UTF8 = b"\x80\xc3\x28" + bytes(range(256))


def test_publish_and_apublish_write_bytes_exactly_with_their_content_type(mysql_url: str) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        producers.publish(conn, "t", NOT_UTF8, key="k", content_type="application/x-protobuf", idempotency_key="pb")
        producers.publish(conn, "t", b"", idempotency_key="empty")  # application/octet-stream
        producers.publish(conn, "t", b"again", idempotency_key="pb")  # a duplicate: nothing written
        assert count(mysql_url) == 0, "publish must not commit by itself"
        conn.commit()
    finally:
        conn.close()

    async def awrite() -> None:
        aconn = await _aconnect(mysql_url)
        try:
            await producers.apublish(aconn, "t", bytearray(NOT_UTF8[::-1]), content_type="a/b", idempotency_key="a")
            await producers.apublish(aconn, "t", memoryview(b"x"), idempotency_key="a")  # a duplicate
            await aconn.commit()
        finally:
            aconn.close()

    asyncio.run(awrite())
    rows = mysql_support.execute(
        mysql_url, "SELECT idempotency_key, payload, payload_bytes, content_type FROM outbox ORDER BY id"
    )
    assert rows == [
        (b"pb", None, NOT_UTF8, "application/x-protobuf"),
        (b"empty", None, b"", "application/octet-stream"),  # empty, not NULL
        (b"a", None, NOT_UTF8[::-1], "a/b"),
    ]


@pytest.mark.parametrize(
    ("payload", "content_type", "error"),
    [
        ({"a": 1}, "application/json", TypeError),  # content_type is for bytes
        (b"x", "", ValueError),
        (b"x", "\u00e9" * 128, ValueError),  # 256 bytes of UTF-8
    ],
)
def test_publish_refuses_a_content_type_it_cannot_keep(
    mysql_url: str, payload: object, content_type: str, error: type[Exception]
) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        with pytest.raises(error):
            producers.publish(conn, "t", payload, content_type=content_type)
        conn.commit()
    finally:
        conn.close()
    assert count(mysql_url) == 0


async def _aconnect(url: str, charset: str = "utf8mb4") -> Any:
    target = Target.parse(url)
    return await asyncmy.connect(
        host=target.host,
        port=target.port,
        user=target.user,
        password=target.password_bytes,
        database=target.database,
        charset=charset,
    )


@pytest.mark.parametrize(
    ("charset", "key"),
    [("latin1", "café"), ("cp1250", "Győr"), ("utf8", "ключ"), ("utf8mb4", "🔑"), ("latin1", "🔑 and ключ")],
)
def test_keys_are_stored_as_utf8_whatever_the_connection_speaks(mysql_url: str, charset: str, key: str) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=False, charset=charset)
    try:
        assert producers.publish(conn, "t", {"n": 1}, key=key, idempotency_key=f"order-{key}") == f"order-{key}"
        conn.commit()
    finally:
        conn.close()

    async def again() -> str:
        aconn = await _aconnect(mysql_url, charset=charset)
        try:
            written = await producers.apublish(aconn, "t", {"n": 2}, key=key, idempotency_key=f"order-{key}")
            await producers.apublish(aconn, "t", {"n": 3}, key=key, idempotency_key=f"next-{key}")
            await aconn.commit()
            return str(written)
        finally:
            aconn.close()

    assert asyncio.run(again()) == f"order-{key}"
    # The same idempotency key from another charset is the same event; the key one key, in UTF-8.
    utf8 = mysql_support.connect(mysql_url, autocommit=False)
    try:
        producers.publish(utf8, "t", {"n": 4}, key=key, idempotency_key=f"order-{key}")
        utf8.commit()
    finally:
        utf8.close()
    rows = mysql_support.execute(mysql_url, "SELECT `key`, idempotency_key, payload FROM outbox ORDER BY id")
    assert [(k, i, json.loads(p)) for k, i, p in rows] == [
        (key.encode(), f"order-{key}".encode(), {"n": 1}),
        (key.encode(), f"next-{key}".encode(), {"n": 3}),
    ]


def test_apublish_with_asyncmy_and_a_table_in_another_database(mysql_url: str, mysql_server_url: str) -> None:
    other = mysql_url.rsplit("/", 1)[1] + "_events"
    deliver_at = datetime.now(timezone(timedelta(hours=2))) + timedelta(minutes=5)
    try:
        migrate(mysql_url, TableName.parse(f"{other}.outbox"))

        async def write(commit: bool) -> str:
            conn = await _aconnect(mysql_url)
            try:
                key = await producers.apublish(conn, "t", [1, 2], table=f"{other}.outbox", deliver_at=deliver_at)
                await (conn.commit() if commit else conn.rollback())
                return key
            finally:
                conn.close()

        key = asyncio.run(write(True))
        asyncio.run(write(False))
        rows = mysql_support.execute(mysql_url, f"SELECT payload, deliver_at FROM `{other}`.outbox")
        assert [(json.loads(p), at) for p, at in rows] == [
            ([1, 2], deliver_at.astimezone(UTC).replace(tzinfo=None))  # stored as UTC
        ]
        assert mysql_support.execute(
            mysql_url, f"SELECT COUNT(*) FROM `{other}`.outbox WHERE idempotency_key = %s", [key]
        ) == [(1,)]
        assert count(mysql_url) == 0
    finally:
        mysql_support.execute(mysql_server_url, f"DROP DATABASE IF EXISTS `{other}`")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        *BAD_ARGUMENTS,
        ({"deliver_at": datetime.now(UTC) + timedelta(days=400)}, ValueError),
        ({"table": "outbox`; drop table outbox;--"}, ConfigError),
    ],
)
def test_bad_arguments_are_refused_before_any_sql(mysql_url: str, kwargs: dict[str, Any], error: type) -> None:
    args: dict[str, Any] = {"topic": "t", "payload": {}, **kwargs}
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        with pytest.raises(error):
            producers.publish(conn, **args)
        conn.commit()
    finally:
        conn.close()
    assert count(mysql_url) == 0


def test_publish_refuses_asyncmy_and_apublish_pymysql_before_any_sql(mysql_url: str) -> None:
    async def wrong_way_round() -> None:
        aconn = await _aconnect(mysql_url)
        try:
            with pytest.raises(TypeError, match="await apublish"):
                producers.publish(aconn, "t", {}, idempotency_key="async-to-publish")
        finally:
            aconn.close()
        conn = mysql_support.connect(mysql_url)
        try:
            with pytest.raises(TypeError, match="call publish"):
                await producers.apublish(conn, "t", {}, idempotency_key="sync-to-apublish")
        finally:
            conn.close()

    asyncio.run(wrong_way_round())
    assert count(mysql_url) == 0


@pytest.mark.parametrize("key", ["k" * 1024, "\u00e9" * 512, "\U0001f600" * 256, " ", "\u00a0"])
def test_keys_up_to_the_limit_are_written(mysql_url: str, key: str) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        written = producers.publish(conn, "t", {}, key=key)
        conn.commit()
    finally:
        conn.close()
    [(stored,)] = mysql_support.execute(mysql_url, "SELECT `key` FROM outbox WHERE idempotency_key = %s", [written])
    assert stored == key.encode()


def _max_allowed_packet(url: str) -> int:
    return int(mysql_support.execute(url, "SELECT @@max_allowed_packet")[0][0])


def _past_the_packet(limit: int) -> list[tuple[str, object]]:
    """Events whose INSERT is longer than ``limit``: by their size, or only once escaped (each byte doubled)."""
    return [
        ("json, larger than the packet", {"s": "x" * (limit + 1)}),
        ("bytes, larger than the packet", b"a" * (limit + 1)),
        ("bytes of NULs, 0.6 x the packet, escaped past it", b"\x00" * (limit * 6 // 10)),
        ("json of quotes, 0.6 x the packet, escaped past it", {"s": "'" * (limit * 6 // 10)}),
    ]


def test_an_event_longer_than_max_allowed_packet_is_refused_and_the_transaction_goes_on(mysql_url: str) -> None:
    """The server would close the connection, losing the caller's transaction; refused before it is sent."""
    limit = _max_allowed_packet(mysql_url)
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        before = producers.publish(conn, "t", {"written": "before"})
        for name, payload in _past_the_packet(limit):
            with pytest.raises(ValueError, match="max_allowed_packet"):
                producers.publish(conn, "t", payload)
            assert conn.open, name
        after = producers.publish(conn, "t", b"b" * (limit * 4 // 10))  # checked, and under it once escaped
        conn.commit()
    finally:
        conn.close()
    rows = mysql_support.execute(mysql_url, "SELECT idempotency_key FROM outbox ORDER BY id")
    assert [r[0] for r in rows] == [before.encode(), after.encode()]

    async def apublish_past_it() -> str:
        aconn = await _aconnect(mysql_url)
        try:
            await aconn.begin()
            kept = await producers.apublish(aconn, "t", {"written": "async"})
            for _, payload in _past_the_packet(limit):
                with pytest.raises(ValueError, match="max_allowed_packet"):
                    await producers.apublish(aconn, "t", payload)
            await aconn.commit()
            return kept
        finally:
            aconn.close()

    kept = asyncio.run(apublish_past_it())
    assert count(mysql_url) == 3
    assert mysql_support.execute(mysql_url, "SELECT COUNT(*) FROM outbox WHERE idempotency_key = %s", [kept]) == [(1,)]


#: Values with every character a literal's escaping could read otherwise: backslashes, quotes, NUL-free
#: control characters, and a key written to close the literal and inject one of its own.
TRICKY = {
    "topic": "t\\o'p\"ic.\U0001f600",
    "key": "', 0x7b7d, 0x7b7d, 'x', UTC_TIMESTAMP(6), 0) -- C:\\temp\\x",
    "idempotency_key": "ik\\1'\"\n\x1a",
    "content_type": 'text/x\'y; q="\\\\\\"\u00e9\U0001f600"',  # a media type: \\ and \" quoted
}


@pytest.mark.parametrize(
    "sql_mode",
    ["NO_BACKSLASH_ESCAPES", "ANSI_QUOTES,NO_BACKSLASH_ESCAPES", "PAD_CHAR_TO_FULL_LENGTH", "", "TRADITIONAL"],
)
@pytest.mark.parametrize("charset", ["utf8mb4", "utf8mb3"])
def test_values_are_stored_exactly_whatever_the_writer_s_sql_mode_and_charset(
    mysql_url: str, sql_mode: str, charset: str
) -> None:
    payload = b"line1\nline2\\end\x00'\""
    conn = mysql_support.connect(mysql_url, autocommit=False, charset=charset)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = %s", [sql_mode])
        for i, body in enumerate(({"a": "\\'\""}, payload)):
            written = producers.publish(
                conn,
                TRICKY["topic"],
                body,
                key=TRICKY["key"],
                idempotency_key=f"{TRICKY['idempotency_key']}{i}",
                content_type=TRICKY["content_type"] if isinstance(body, bytes) else None,
            )
            assert written == f"{TRICKY['idempotency_key']}{i}"
        conn.commit()
    finally:
        conn.close()

    async def asynchronous() -> None:
        aconn = await _aconnect(mysql_url, charset="utf8mb4" if charset == "utf8mb4" else "utf8")
        try:
            async with aconn.cursor() as cur:
                await cur.execute("SET SESSION sql_mode = %s", [sql_mode])
            await producers.apublish(
                aconn,
                TRICKY["topic"],
                payload,
                key=TRICKY["key"],
                idempotency_key=f"{TRICKY['idempotency_key']}a",
                content_type=TRICKY["content_type"],
            )
            # The same idempotency key again, as stored: nothing more written (the same topic: a repeat).
            again = f"{TRICKY['idempotency_key']}0"
            await producers.apublish(aconn, TRICKY["topic"], {"n": 1}, idempotency_key=again)
            with pytest.raises(producers.IdempotencyKeyTaken):  # another topic: another writer's event
                await producers.apublish(aconn, "t", {"n": 1}, idempotency_key=again)
            await aconn.commit()
        finally:
            aconn.close()

    asyncio.run(asynchronous())
    rows = mysql_support.execute(
        mysql_url,
        "SELECT topic, `key`, idempotency_key, payload, payload_bytes, content_type FROM outbox ORDER BY id",
    )
    key, topic = TRICKY["key"].encode(), TRICKY["topic"]
    assert [(r[0], r[1], r[2], r[4], r[5]) for r in rows] == [
        (topic, key, f"{TRICKY['idempotency_key']}0".encode(), None, None),
        (topic, key, f"{TRICKY['idempotency_key']}1".encode(), payload, TRICKY["content_type"]),
        (topic, key, f"{TRICKY['idempotency_key']}a".encode(), payload, TRICKY["content_type"]),
    ]
    assert json.loads(rows[0][3]) == {"a": "\\'\""}


@pytest.mark.parametrize("dict_rows", ["pymysql", "asyncmy"])
def test_a_large_event_is_checked_against_max_allowed_packet_from_a_dict_cursor_connection(
    mysql_url: str, dict_rows: str
) -> None:
    big = {"x": "y" * 600_000}  # past the size whose statement is checked before it is sent
    if dict_rows == "pymysql":
        conn = mysql_support.connect(mysql_url, autocommit=False, cursorclass=pymysql.cursors.DictCursor)
        try:
            producers.publish(conn, "t", big, idempotency_key="big")
            conn.commit()
        finally:
            conn.close()
    else:

        async def asynchronous() -> None:
            target = Target.parse(mysql_url)
            aconn = await asyncmy.connect(
                host=target.host,
                port=target.port,
                user=target.user,
                password=target.password_bytes,
                database=target.database,
                cursor_cls=asyncmy.cursors.DictCursor,
            )
            try:
                await producers.apublish(aconn, "t", big, idempotency_key="big")
                await aconn.commit()
            finally:
                aconn.close()

        asyncio.run(asynchronous())
    assert mysql_support.execute(mysql_url, "SELECT idempotency_key FROM outbox") == [(b"big",)]


#: Non-ASCII text of every width in UTF-8, beside what JSON escapes whatever the setting.
NON_ASCII_PAYLOADS = [
    {"name": "café"},
    {"城市": "東京", "note": "ключ"},
    ["🎉", "a\u2028b", "\U0010fffd"],
    {"mixed": 'quote " backslash \\ tab \t é', "n": 1},
    "ünïcödé alone",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("charset", ["utf8mb4", "utf8mb3", "latin1"])
def test_a_json_payload_is_delivered_as_utf8_text_as_on_postgresql(mysql_url: str, amqp_url: str, charset: str) -> None:
    """The body is the payload's JSON with its characters as UTF-8, as PostgreSQL's jsonb sends it:
    written escaped (\\u00e9), it reached consumers as other bytes, up to three times as long."""
    with temp_queue(amqp_url) as queue:
        conn = mysql_support.connect(mysql_url, autocommit=False, charset=charset)
        try:
            for i, payload in enumerate(NON_ASCII_PAYLOADS):
                producers.publish(conn, queue.name, payload, key="k", idempotency_key=f"sync-{i}")
            conn.commit()
        finally:
            conn.close()

        async def awrite() -> None:
            aconn = await _aconnect(mysql_url, charset="utf8" if charset == "utf8mb3" else charset)
            try:
                for i, payload in enumerate(NON_ASCII_PAYLOADS):
                    await producers.apublish(aconn, queue.name, payload, key="k", idempotency_key=f"async-{i}")
                await aconn.commit()
            finally:
                aconn.close()

        asyncio.run(awrite())
        with RelayThread(mysql_url, amqp_url):
            messages = queue.collect(2 * len(NON_ASCII_PAYLOADS))
    wanted = [json.dumps(p, ensure_ascii=False).encode() for p in NON_ASCII_PAYLOADS] * 2
    assert [m.body for m in messages] == wanted
    assert [m.message_id for m in messages] == [f"{w}-{i}" for w in ("sync", "async") for i in range(5)]


AUTOCOMMIT_WARNED = "autocommit mode outside a transaction commits the event on its own"


def test_publish_on_an_autocommit_pymysql_connection_outside_a_transaction_warns(mysql_url: str) -> None:
    conn = mysql_support.connect(mysql_url, autocommit=True)
    try:
        with pytest.warns(producers.AutocommitWarning, match=AUTOCOMMIT_WARNED):
            producers.publish(conn, "t", {"n": 1}, idempotency_key="alone")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            conn.begin()  # a transaction on the same connection: the event goes with it
            producers.publish(conn, "t", {"n": 2}, idempotency_key="begun")
            conn.rollback()
            conn.begin()
            producers.publish(conn, "t", {"n": 3}, idempotency_key="committed")
            conn.commit()
        with pytest.warns(producers.AutocommitWarning, match="allow_autocommit=True"):  # the transaction is over
            producers.publish(conn, "t", b"raw", content_type="a/b", idempotency_key="raw")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            producers.publish(conn, "t", {"n": 4}, idempotency_key="on-purpose", allow_autocommit=True)
            conn.autocommit(False)
            producers.publish(conn, "t", {"n": 5}, idempotency_key="implicit")
            conn.rollback()
    finally:
        conn.close()
    keys = mysql_support.execute(mysql_url, "SELECT idempotency_key FROM outbox ORDER BY id")
    assert [k for (k,) in keys] == [b"alone", b"committed", b"raw", b"on-purpose"]


def test_apublish_on_an_autocommit_asyncmy_connection_outside_a_transaction_warns(mysql_url: str) -> None:
    async def scenario() -> None:
        aconn = await _aconnect(mysql_url)
        try:
            await aconn.autocommit(True)
            with pytest.warns(producers.AutocommitWarning, match=AUTOCOMMIT_WARNED):
                await producers.apublish(aconn, "t", {"n": 1}, idempotency_key="alone")
            await aconn.begin()
            await producers.apublish(aconn, "t", {"n": 2}, idempotency_key="begun")
            await aconn.commit()
        finally:
            aconn.close()

    asyncio.run(scenario())
    keys = mysql_support.execute(mysql_url, "SELECT idempotency_key FROM outbox ORDER BY id")
    assert [k for (k,) in keys] == [b"alone", b"begun"]
