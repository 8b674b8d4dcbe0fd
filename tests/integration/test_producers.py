"""producers.publish / apublish write in the caller's transaction only."""

from __future__ import annotations

import asyncio
import json
import uuid
import warnings
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import psycopg.types.json
import pytest

import producers
from relay.config import TableName
from relay.errors import ConfigError
from relay.store.migrate import migrate
from tests.producer_cases import BAD_ARGUMENTS


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


@pytest.mark.parametrize("payloads", [({"v": 1}, {"v": 2}), (b"\x00first", b"\x00second"), ({"v": 1}, b"second")])
@pytest.mark.parametrize("same_transaction", [True, False])
def test_a_given_key_dedupes_in_both_apis_whatever_the_payload(
    database_url: str, payloads: tuple[object, object], same_transaction: bool
) -> None:
    """Only a key publish() makes itself skips the conflict check: a caller's key is checked on every path."""

    async def write_async(payload: object) -> str:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            key = await producers.apublish(conn, "t", payload, idempotency_key="order-7")
            await conn.commit()
            return key

    with psycopg.connect(database_url) as conn:
        assert producers.publish(conn, "t", payloads[0], idempotency_key="order-7") == "order-7"
        if same_transaction:
            assert producers.publish(conn, "t", payloads[1], idempotency_key="order-7") == "order-7"
        conn.commit()
    if not same_transaction:
        assert asyncio.run(write_async(payloads[1])) == "order-7"
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT payload, payload_bytes FROM outbox").fetchall()
    first = payloads[0]
    assert rows == [(None, first) if isinstance(first, bytes) else (first, None)]


def test_keys_publish_makes_are_distinct_and_written(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        keys = [
            producers.publish(conn, "t", {"i": i} if i % 3 else f"{i}".encode(), idempotency_key=None if i % 2 else "")
            for i in range(50)
        ]
        conn.commit()
        stored = {row[0] for row in conn.execute("SELECT idempotency_key FROM outbox")}
    assert len(set(keys)) == 50
    assert stored == set(keys)


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
        *BAD_ARGUMENTS,
        ({"table": 'outbox"; drop table outbox;--'}, ConfigError),
    ],
)
def test_bad_arguments_are_refused_before_any_sql(database_url: str, kwargs: dict[str, object], error: type) -> None:
    args: dict[str, object] = {"topic": "t", "payload": {}, **kwargs}
    topic, payload = args.pop("topic"), args.pop("payload")
    with psycopg.connect(database_url) as conn:
        with pytest.raises(error):
            producers.publish(conn, topic, payload, **args)  # type: ignore[arg-type]
        # Nothing reached the table, and the caller's transaction goes on (psycopg may have begun it).
        assert conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
    assert count(database_url) == 0


A_YEAR_AND_A_DAY = timedelta(days=366)
FAR_AHEAD = [
    pytest.param(datetime(9999, 12, 31, tzinfo=UTC), id="year 9999"),
    pytest.param("soon", id="not a datetime"),
    pytest.param(float("nan"), id="NaN"),
    pytest.param(datetime(2030, 1, 1).date(), id="a date"),
    pytest.param(datetime.now() + timedelta(hours=1), id="naive"),
]


@pytest.mark.parametrize("deliver_at", [*FAR_AHEAD, pytest.param("a year and a day", id="a year and a day ahead")])
@pytest.mark.parametrize("flavour", ["publish", "apublish"])
def test_absurd_deliver_at_values_are_refused_with_the_transaction_untouched(
    database_url: str, deliver_at: object, flavour: str
) -> None:
    if deliver_at == "a year and a day":
        deliver_at = datetime.now(UTC) + A_YEAR_AND_A_DAY
    with psycopg.connect(database_url) as conn:
        with pytest.raises((TypeError, ValueError), match="deliver_at"):
            if flavour == "publish":
                producers.publish(conn, "t", {}, deliver_at=deliver_at)  # type: ignore[arg-type]
            else:
                asyncio.run(_apublish_via(database_url, deliver_at))
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert count(database_url) == 0


async def _apublish_via(url: str, deliver_at: object) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await producers.apublish(conn, "t", {}, deliver_at=deliver_at)  # type: ignore[arg-type]


def test_deliver_at_within_the_horizon_or_past_is_written_and_the_horizon_widens_to_the_tables(
    database_url: str,
) -> None:
    now = datetime.now(UTC)
    allowed = {
        "past": now - timedelta(days=3650),
        "next year": now + producers.MAX_DELIVER_AHEAD - timedelta(minutes=1),
        "another zone": (now + timedelta(days=1)).astimezone(timezone(timedelta(hours=-7))),
    }
    with psycopg.connect(database_url) as conn:
        for name, when in allowed.items():
            producers.publish(conn, "t", {}, idempotency_key=name, deliver_at=when)
        widened = {"deliver_at": now + timedelta(days=365, hours=12), "max_deliver_ahead": timedelta(days=366)}
        producers.publish(conn, "t", {}, idempotency_key="in a year and a half day", **widened)  # type: ignore[arg-type]
        conn.commit()
        rows: dict[str, datetime] = dict(conn.execute("SELECT idempotency_key, deliver_at FROM outbox").fetchall())
    assert rows == {**allowed, "in a year and a half day": now + timedelta(days=365, hours=12)}


@pytest.mark.parametrize("given", [uuid.UUID(int=7), 0, 12345])
def test_a_uuid_or_an_int_idempotency_key_is_written_as_text_and_dedupes(database_url: str, given: object) -> None:
    with psycopg.connect(database_url) as conn:
        first = producers.publish(conn, "t", {"n": 1}, idempotency_key=given)  # type: ignore[arg-type]
        again = producers.publish(conn, "t", {"n": 2}, idempotency_key=given)  # type: ignore[arg-type]
    assert first == again == str(given)
    assert count(database_url) == 1


def test_publish_refuses_an_async_connection_and_apublish_a_sync_one_before_any_sql(database_url: str) -> None:
    async def wrong_way_round() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            with pytest.raises(TypeError, match="await apublish"):
                producers.publish(aconn, "t", {}, idempotency_key="async-to-publish")
            async with aconn.cursor() as acur:
                with pytest.raises(TypeError, match="await apublish"):
                    producers.publish(acur, "t", {})
            await aconn.commit()
        with psycopg.connect(database_url) as conn:
            with pytest.raises(TypeError, match="call publish"):
                await producers.apublish(conn, "t", {}, idempotency_key="sync-to-apublish")
            with pytest.raises(TypeError, match="call publish"):
                await producers.apublish(conn.cursor(), "t", {})
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    asyncio.run(wrong_way_round())
    assert count(database_url) == 0


@pytest.mark.parametrize(
    "payload", [{"emoji": "\U0001f600", "cjk": "\u65e5\u672c"}, ["\\ud800 written out"], "\\u0000"]
)
def test_payloads_past_the_bmp_or_with_escapes_written_out_are_published(database_url: str, payload: object) -> None:
    with psycopg.connect(database_url) as conn:
        key = producers.publish(conn, "t", payload, headers={"h": "\U0001f600"})
        row = conn.execute("SELECT payload, headers FROM outbox WHERE idempotency_key = %s", [key]).fetchone()
    assert row == (payload, {"h": "\U0001f600"})


def test_a_connection_s_own_json_dumper_still_writes_what_json_cannot(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        psycopg.types.json.set_json_dumps(lambda value: json.dumps(value, default=str), conn)
        key = producers.publish(conn, "t", {"amount": Decimal("1.50")})
        row = conn.execute("SELECT payload FROM outbox WHERE idempotency_key = %s", [key]).fetchone()
    assert row == ({"amount": "1.50"},)


@pytest.mark.parametrize("key", ["k" * 1024, "\u00e9" * 512, "\U0001f600" * 256, " ", "\u00a0"])
def test_keys_up_to_the_limit_are_written(database_url: str, key: str) -> None:
    with psycopg.connect(database_url) as conn:
        written = producers.publish(conn, "t", {}, key=key)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT key FROM outbox WHERE idempotency_key = %s", [written]).fetchone() == (key,)


@pytest.mark.parametrize("factory", [psycopg.Cursor, psycopg.ClientCursor, psycopg.RawCursor])
def test_publish_writes_whatever_cursors_the_connection_makes(database_url: str, factory: type) -> None:
    with psycopg.connect(database_url, cursor_factory=factory) as conn:
        producers.publish(conn, "t", {"n": 1}, key="k", idempotency_key="via-conn")
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT idempotency_key FROM outbox").fetchall() == [("via-conn",)]

    async def asynchronous() -> None:
        counterparts: dict[type, type] = {
            psycopg.Cursor: psycopg.AsyncCursor,
            psycopg.ClientCursor: psycopg.AsyncClientCursor,
        }
        afactory = counterparts.get(factory, psycopg.AsyncRawCursor)
        async with await psycopg.AsyncConnection.connect(database_url, cursor_factory=afactory) as aconn:
            await producers.apublish(aconn, "t", {"n": 2}, idempotency_key="via-aconn")

    asyncio.run(asynchronous())
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (2,)


def test_a_server_side_or_raw_cursor_is_refused_before_any_sql(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TEMP TABLE business (n int)")
        conn.execute("INSERT INTO business VALUES (1)")
        for cursor in (conn.cursor("named"), psycopg.RawCursor(conn)):
            with cursor, pytest.raises(TypeError, match="takes a connection or a client-side cursor"):
                producers.publish(cursor, "t", {"n": 1})
        producers.publish(conn.cursor(), "t", {"n": 1}, idempotency_key="by-cursor")  # a plain cursor is fine
        assert conn.execute("SELECT count(*) FROM business").fetchone() == (1,)


#: publish() on psycopg and PyMySQL, apublish() on psycopg's AsyncConnection and asyncmy.
DRIVERS = ["psycopg", "psycopg-async", "pymysql", "asyncmy"]


def _outcome(call: Callable[[], object]) -> tuple[type[BaseException], str] | str:
    try:
        return str(call())
    except Exception as exc:  # noqa: BLE001 - the class and message are what the test compares
        return type(exc), str(exc)


def _in_a_business_transaction(request: pytest.FixtureRequest, driver: str, kwargs: dict[str, Any]) -> object:
    """What publish (or apublish) with ``kwargs`` gives on ``driver``, inside a transaction that wrote a row
    first; asserts that the row is still there afterwards (the transaction usable) and that nothing is committed."""
    args: dict[str, Any] = {"topic": "t", "payload": {}, **kwargs}
    if driver.startswith("psycopg"):
        url = request.getfixturevalue("database_url")
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS business (n int)")
            conn.commit()

        async def apsycopg() -> object:
            async with await psycopg.AsyncConnection.connect(url) as aconn:
                await aconn.execute("INSERT INTO business VALUES (1)")
                outcome = await _aoutcome(producers.apublish(aconn, **args))
                cur = await aconn.execute("SELECT count(*) FROM business")
                assert await cur.fetchone() == (1,), "the caller's transaction must go on"
                await aconn.rollback()
                return outcome

        if driver == "psycopg-async":
            outcome = asyncio.run(apsycopg())
        else:
            with psycopg.connect(url) as conn:
                conn.execute("INSERT INTO business VALUES (1)")
                outcome = _outcome(lambda: producers.publish(conn, **args))
                assert conn.execute("SELECT count(*) FROM business").fetchone() == (1,)
                conn.rollback()
        assert count(url) == 0
        return outcome
    from tests import mysql_support
    from tests.integration.test_mysql_producers import _aconnect

    url = request.getfixturevalue("mysql_url")
    mysql_support.execute(url, "CREATE TABLE IF NOT EXISTS business (n int) ENGINE = InnoDB")

    async def aasyncmy() -> object:
        aconn = await _aconnect(url)
        try:
            async with aconn.cursor() as cur:
                await cur.execute("INSERT INTO business VALUES (1)")
            outcome = await _aoutcome(producers.apublish(aconn, **args))
            async with aconn.cursor() as cur:
                await cur.execute("SELECT count(*) FROM business")
                assert await cur.fetchone() == (1,), "the caller's transaction must go on"
            await aconn.rollback()
            return outcome
        finally:
            aconn.close()

    if driver == "asyncmy":
        outcome = asyncio.run(aasyncmy())
    else:
        my_conn = mysql_support.connect(url, autocommit=False)
        try:
            with my_conn.cursor() as cur:
                cur.execute("INSERT INTO business VALUES (1)")
            outcome = _outcome(lambda: producers.publish(my_conn, **args))
            with my_conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM business")
                assert cur.fetchone() == (1,), "the caller's transaction must go on"
            my_conn.rollback()
        finally:
            my_conn.close()
    assert int(mysql_support.execute(url, "SELECT COUNT(*) FROM outbox")[0][0]) == 0
    return outcome


async def _aoutcome(call: Awaitable[object]) -> tuple[type[BaseException], str] | str:
    try:
        return str(await call)
    except Exception as exc:  # noqa: BLE001 - the class and message are what the test compares
        return type(exc), str(exc)


NUL_IN_CONTENT_TYPE = (ValueError, "content_type holds a NUL character (\\x00), which PostgreSQL cannot store")


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("payload", "content_type"),
    [
        (b"x", "\x00"),
        (b"", "application/x-protobuf\x00"),
        (bytearray(b"\x00"), "text/plain\x00; charset=utf-8"),
        (memoryview(b"x"), "\x00\x00"),
    ],
)
def test_a_nul_in_content_type_is_refused_before_any_sql_on_every_driver(
    request: pytest.FixtureRequest, driver: str, payload: object, content_type: str
) -> None:
    """psycopg refused it while sending (a DataError), the MySQL drivers wrote it."""
    outcome = _in_a_business_transaction(request, driver, {"payload": payload, "content_type": content_type})
    assert outcome == NUL_IN_CONTENT_TYPE


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_content_type_that_is_no_media_type_is_refused_before_any_sql_on_every_driver(
    request: pytest.FixtureRequest, driver: str
) -> None:
    """The relay sends it as a header (and CloudEvents' datacontenttype): it must be type/subtype[; params].
    (The family of such values, without I/O: tests/unit/test_producer_values.py.)"""
    content_type = "text/plain\r\nX-Injected: 1"
    outcome = _in_a_business_transaction(request, driver, {"payload": b"x", "content_type": content_type})
    assert isinstance(outcome, tuple) and outcome[0] is ValueError, outcome
    assert outcome[1].startswith(f"content_type {content_type!r} ") and "\n" not in outcome[1]


def _nested(depth: int, container: str) -> object:
    """``depth`` arrays or objects (``mixed``: alternately) one in another, around a scalar."""
    value: object = 1
    for level in range(depth):
        as_object = container == "object" or (container == "mixed" and level % 2 == 1)
        value = {"a": value, "b": 2} if as_object else [value, "x"]
    return value


TOO_DEEP = (ValueError, "payload is nested more than 31 arrays or objects deep, which MariaDB's JSON cannot store")


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("container", ["array", "object", "mixed"])
@pytest.mark.parametrize("depth", [32, 33, 100, 999, 5000])
def test_a_payload_nested_deeper_than_mariadb_keeps_is_refused_before_any_sql_on_every_driver(
    request: pytest.FixtureRequest, driver: str, container: str, depth: int
) -> None:
    """PostgreSQL took it, MariaDB's JSON check refused it (error 4025), and past Python's recursion
    limit json.dumps raised a RecursionError: one ValueError everywhere now."""
    outcome = _in_a_business_transaction(request, driver, {"payload": _nested(depth, container)})
    assert outcome == TOO_DEEP


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("container", ["array", "object", "mixed", "tuple"])
@pytest.mark.parametrize("depth", [0, 1, 30, 31])
def test_a_payload_nested_up_to_the_limit_is_written_on_every_driver(
    request: pytest.FixtureRequest, driver: str, container: str, depth: int
) -> None:
    payload = (_nested(depth - 1, "mixed"),) if container == "tuple" and depth else _nested(depth, container)
    outcome = _in_a_business_transaction(request, driver, {"payload": payload, "idempotency_key": "deep"})
    assert outcome == "deep"


@pytest.mark.parametrize(
    ("what", "function", "expected"),
    [
        ("None", "publish", "publish() takes a connection, not NoneType"),
        ("None", "apublish", "apublish() takes a connection, not NoneType"),
        ("a URL", "publish", "publish() takes a connection, not str"),
        ("a URL", "apublish", "apublish() takes a connection, not str"),
        ("psycopg's PGconn", "publish", "publish() takes a connection, not PGconn"),
        ("a PyMySQL cursor", "publish", "publish() takes a connection, not Cursor"),
        ("a PyMySQL dict cursor", "publish", "publish() takes a connection, not DictCursor"),
        ("an asyncmy cursor", "apublish", "apublish() takes a connection, not Cursor"),
        ("an asyncmy pool", "apublish", "apublish() takes a connection, not Pool: take a connection from the pool"),
    ],
)
def test_what_is_not_a_connection_is_refused_with_a_type_error_before_any_sql(
    request: pytest.FixtureRequest, what: str, function: str, expected: str
) -> None:
    """An AttributeError from inside publish() before; pools and cursors are the usual mix-ups."""
    import asyncmy
    import pymysql.cursors

    from relay.store.mysql import Target
    from tests import mysql_support
    from tests.integration.test_mysql_producers import _aconnect

    async def call(target: object) -> None:
        if function == "publish":
            producers.publish(target, "t", {})
        else:
            await producers.apublish(target, "t", {})

    async def attempt() -> None:
        if what in ("None", "a URL", "psycopg's PGconn"):
            url = request.getfixturevalue("database_url")
            with psycopg.connect(url) as conn:
                target = {"None": None, "a URL": url, "psycopg's PGconn": conn.pgconn}[what]
                with pytest.raises(TypeError) as raised:
                    await call(target)
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert str(raised.value) == expected
            assert count(url) == 0
            return
        url = request.getfixturevalue("mysql_url")
        if what.startswith("a PyMySQL"):
            my_conn = mysql_support.connect(url, autocommit=False)
            cursor_class = pymysql.cursors.DictCursor if "dict" in what else pymysql.cursors.Cursor
            try:
                with my_conn.cursor(cursor_class) as cur, pytest.raises(TypeError) as raised:
                    await call(cur)
                my_conn.commit()
            finally:
                my_conn.close()
        elif what == "an asyncmy cursor":
            aconn = await _aconnect(url)
            try:
                async with aconn.cursor() as acur:
                    with pytest.raises(TypeError) as raised:
                        await call(acur)
                await aconn.commit()
            finally:
                aconn.close()
        else:
            target = Target.parse(url)
            pool = await asyncmy.create_pool(
                host=target.host, port=target.port, user=target.user, password=target.password_bytes,
                db=target.database, minsize=1, maxsize=1,
            )  # fmt: skip
            try:
                with pytest.raises(TypeError) as raised:
                    await call(pool)
            finally:
                pool.close()
                await pool.wait_closed()
        assert str(raised.value) == expected
        assert int(mysql_support.execute(url, "SELECT COUNT(*) FROM outbox")[0][0]) == 0

    asyncio.run(attempt())


@pytest.mark.parametrize(("kwargs", "error"), BAD_ARGUMENTS)
def test_bad_arguments_give_one_error_on_every_driver(
    request: pytest.FixtureRequest, kwargs: dict[str, object], error: type
) -> None:
    """The same class and message from publish and apublish on all four drivers, the transaction going on."""
    outcomes = {driver: _in_a_business_transaction(request, driver, kwargs) for driver in DRIVERS}
    first = outcomes["psycopg"]
    assert isinstance(first, tuple) and issubclass(first[0], error), outcomes
    assert all(outcome == first for outcome in outcomes.values()), outcomes


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("what", "kwargs"),
    [
        ("topic", {"topic": "\ud800"}),
        ("topic", {"topic": "orders.\udfff"}),
        ("key", {"key": "order-\ud83d"}),  # half of an emoji's surrogate pair
        ("key", {"key": "\u00e9\udc80"}),
        ("idempotency_key", {"idempotency_key": "\udc80-1"}),
        ("content_type", {"payload": b"x", "content_type": "text/\ud800"}),
    ],
)
def test_a_lone_surrogate_in_a_text_argument_is_refused_naming_the_argument_on_every_driver(
    request: pytest.FixtureRequest, driver: str, what: str, kwargs: dict[str, object]
) -> None:
    """The codec's UnicodeEncodeError named no argument ("'utf-8' codec can't encode character ...")."""
    outcome = _in_a_business_transaction(request, driver, kwargs)
    assert outcome == (ValueError, f"{what} holds a lone surrogate (\\ud800-\\udfff), which is not text")


AUTOCOMMIT_WARNED = "autocommit mode outside a transaction commits the event on its own"


def test_publish_on_an_autocommit_connection_outside_a_transaction_warns_and_writes_the_event_alone(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for n, target in enumerate((conn, conn.cursor())):
            with pytest.warns(producers.AutocommitWarning, match=AUTOCOMMIT_WARNED):
                producers.publish(target, "t", {"n": 1}, idempotency_key=f"alone-{n}")
            with pytest.warns(producers.AutocommitWarning, match="allow_autocommit=True"):
                producers.publish(target, "t", b"raw", content_type="a/b", idempotency_key=f"raw-{n}")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # none of these warns
            with conn.transaction():  # a transaction block on the same connection: the event goes with it
                producers.publish(conn, "t", {"n": 2}, idempotency_key="in-a-block")
            with conn.transaction(force_rollback=True):
                producers.publish(conn.cursor(), "t", {"n": 3}, idempotency_key="rolled-back")
            producers.publish(conn, "t", {"n": 4}, idempotency_key="on-purpose", allow_autocommit=True)
    with psycopg.connect(database_url) as conn, warnings.catch_warnings():
        warnings.simplefilter("error")  # not in autocommit mode: publish opens no transaction of its own
        producers.publish(conn, "t", {"n": 5}, idempotency_key="implicit")
        conn.commit()
        producers.publish(conn, "t", {"n": 6}, idempotency_key="after-a-commit")
        conn.rollback()
        keys = conn.execute("SELECT idempotency_key FROM outbox ORDER BY id").fetchall()
    assert keys == [("alone-0",), ("raw-0",), ("alone-1",), ("raw-1",), ("in-a-block",), ("on-purpose",), ("implicit",)]


def test_apublish_on_an_autocommit_connection_outside_a_transaction_warns(database_url: str) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
            for n, target in enumerate((aconn, aconn.cursor())):
                with pytest.warns(producers.AutocommitWarning, match=AUTOCOMMIT_WARNED):
                    await producers.apublish(target, "t", {"n": 1}, idempotency_key=f"alone-{n}")
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                async with aconn.transaction():
                    await producers.apublish(aconn, "t", {"n": 2}, idempotency_key="in-a-block")
                await producers.apublish(aconn, "t", {}, idempotency_key="on-purpose", allow_autocommit=True)

    asyncio.run(scenario())
    with psycopg.connect(database_url) as conn:
        keys = conn.execute("SELECT idempotency_key FROM outbox ORDER BY id").fetchall()
    assert keys == [("alone-0",), ("alone-1",), ("in-a-block",), ("on-purpose",)]
