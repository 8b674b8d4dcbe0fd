"""What a writer may put in ``deliver_at`` and ``priority``, bounded by the table itself (migration 0005), and an
idempotency key another writer took first (publish() says so).

Through plain SQL as the table's owner and through the writer role of
``migrate --create-roles``, on real PostgreSQL and MariaDB: a time past the
table's 366 days, a time that is no time, and a priority outside -1000..1000
are refused; the edges of what is allowed are written. Rows written before the
bound stay, and the relay may still change them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pymysql
import pytest

import producers
from relay.config import TableName
from relay.store.migrate import create_roles, migrate
from relay.store.mysql import Target
from relay.store.mysql import migrate as mysql_migrate
from tests import mysql_support

TABLE = TableName.parse("outbox")

#: (column, SQL value) the table refuses on PostgreSQL: each would hold a key back for good, or go before
#: every other writer's events.
PG_REFUSED = [
    ("deliver_at", "'infinity'"),
    ("deliver_at", "'-infinity'"),
    ("deliver_at", "'9999-12-31'"),
    ("deliver_at", "now() + interval '2 years'"),
    ("deliver_at", "now() + interval '367 days'"),
    ("priority", "2147483647"),
    ("priority", "-2147483648"),
    ("priority", "1001"),
    ("priority", "-1001"),
]
PG_TAKEN = [
    ("deliver_at", "now() + interval '365 days'"),
    ("deliver_at", "'2000-01-01'"),
    ("deliver_at", "now()"),
    ("priority", "1000"),
    ("priority", "-1000"),
    ("priority", "0"),
]
MYSQL_REFUSED = [
    ("deliver_at", "'9999-12-31 23:59:59.999999'"),
    ("deliver_at", "'9999-12-31'"),
    ("deliver_at", "UTC_TIMESTAMP(6) + INTERVAL 2 YEAR"),
    ("deliver_at", "UTC_TIMESTAMP(6) + INTERVAL 367 DAY"),
    ("priority", "2147483647"),
    ("priority", "-2147483648"),
    ("priority", "1001"),
    ("priority", "-1001"),
]
MYSQL_TAKEN = [
    ("deliver_at", "UTC_TIMESTAMP(6) + INTERVAL 365 DAY"),
    ("deliver_at", "'2000-01-01'"),
    ("priority", "1000"),
    ("priority", "-1000"),
]


@pytest.fixture
def pg_writer_role(database_url: str) -> Iterator[str]:
    suffix = uuid.uuid4().hex[:8]
    relay, writer = f"relay_b_{suffix}", f"writer_b_{suffix}"
    create_roles(database_url, TABLE, relay_role=relay, writer_role=writer)
    yield writer
    with psycopg.connect(database_url, autocommit=True) as conn:
        for role in (relay, writer):
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def pg_outcomes(url: str, role: str | None, cases: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Insert one event per case (each in a savepoint), as ``role`` if given: what happened to each."""
    outcomes = {}
    with psycopg.connect(url) as conn:
        if role:
            conn.execute(f'SET ROLE "{role}"')
        for n, (column, value) in enumerate(cases):
            try:
                with conn.transaction():
                    conn.execute(
                        f"INSERT INTO outbox (topic, payload, idempotency_key, {column})"  # test SQL from constants
                        f" VALUES ('t', '{{}}', 'e{n}', {value})"
                    )
                outcomes[(column, value)] = "written"
            except psycopg.errors.CheckViolation as exc:
                assert column in str(exc)  # the message names what was refused
                outcomes[(column, value)] = "refused"
    return outcomes


@pytest.mark.parametrize("as_writer", [False, True], ids=["plain INSERT", "writer role"])
def test_postgresql_refuses_times_and_priorities_out_of_bounds(
    database_url: str, pg_writer_role: str, as_writer: bool
) -> None:
    outcomes = pg_outcomes(database_url, pg_writer_role if as_writer else None, PG_REFUSED + PG_TAKEN)
    assert outcomes == {**dict.fromkeys(PG_REFUSED, "refused"), **dict.fromkeys(PG_TAKEN, "written")}


def test_postgresql_rows_written_before_the_bound_stay_and_the_relay_still_changes_them(empty_database: str) -> None:
    migrate(empty_database, TABLE)
    with psycopg.connect(empty_database, autocommit=True) as conn:  # back to version 4
        conn.execute("DROP TRIGGER outbox_writer_bounds ON outbox")
        conn.execute("DELETE FROM outbox_schema_version WHERE version = 5")
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, deliver_at, priority)"
            " VALUES ('t', 'k', '{}', 'infinity', 2147483647)"
        )
    assert migrate(empty_database, TABLE) == [5]
    with psycopg.connect(empty_database, autocommit=True) as conn:
        # What skip and a retry write: the row is judged only when inserted.
        conn.execute("UPDATE outbox SET state = 'skipped', attempts = attempts + 1")
        rows = conn.execute("SELECT deliver_at::text, priority, state FROM outbox").fetchall()
    assert rows == [("infinity", 2147483647, "skipped")]


@pytest.fixture
def mysql_writer_url(mysql_url: str) -> Iterator[str]:
    """A login user of MariaDB in the writer role of ``migrate --create-roles``."""
    suffix = uuid.uuid4().hex[:8]
    relay_role, writer_role, user, password = f"relay_b_{suffix}", f"writer_b_{suffix}", f"app_{suffix}", suffix * 2
    target = Target.parse(mysql_url)
    mysql_migrate.create_roles(mysql_url, TABLE, relay_role=relay_role, writer_role=writer_role)
    mysql_support.execute(mysql_url, f"CREATE USER `{user}`@'%' IDENTIFIED BY '{password}'")  # hex digits
    mysql_support.execute(mysql_url, f"GRANT `{writer_role}` TO `{user}`@'%'")
    mysql_support.execute(mysql_url, f"SET DEFAULT ROLE `{writer_role}` FOR `{user}`@'%'")
    yield f"mysql://{user}:{password}@{target.host}:{target.port}/{target.database}"
    mysql_support.execute(mysql_url, f"DROP USER IF EXISTS `{user}`@'%'")
    for role in (relay_role, writer_role):
        mysql_support.execute(mysql_url, f"DROP ROLE IF EXISTS `{role}`")


@pytest.mark.parametrize("as_writer", [False, True], ids=["plain INSERT", "writer role"])
def test_mariadb_refuses_times_and_priorities_out_of_bounds(
    mysql_url: str, mysql_writer_url: str, as_writer: bool
) -> None:
    outcomes = {}
    conn = mysql_support.connect(mysql_writer_url if as_writer else mysql_url)
    try:
        with conn.cursor() as cur:
            for n, (column, value) in enumerate(MYSQL_REFUSED + MYSQL_TAKEN):
                try:
                    statement = f"INSERT INTO outbox (topic, payload, idempotency_key, {column})"
                    cur.execute(f"{statement} VALUES ('t', '{{}}', 'e{n}', {value})")  # test SQL from constants
                    outcomes[(column, value)] = "written"
                except pymysql.err.OperationalError as exc:
                    assert exc.args[0] == 1644 and column in exc.args[1]  # SIGNAL SQLSTATE '45000', named
                    outcomes[(column, value)] = "refused"
    finally:
        conn.close()
    assert outcomes == {**dict.fromkeys(MYSQL_REFUSED, "refused"), **dict.fromkeys(MYSQL_TAKEN, "written")}
    assert mysql_support.execute(mysql_url, "SELECT COUNT(*) FROM outbox") == [(len(MYSQL_TAKEN),)]


#: (topic, key) another writer may write under a key first, and whether the owner's publish() of ("orders", "o-1")
#: then says so: another topic is another event; the same topic is taken for a retry, whatever its key and payload.
TAKEN_BY = [
    (("payments", "o-1"), True),
    (("payments", None), True),
    (("Orders", "o-1"), True),
    (("orders ", "o-1"), True),
    (("orders", "o-1"), False),
    (("orders", "o-2"), False),
    (("orders", None), False),
]


@pytest.mark.parametrize("as_writer", [False, True], ids=["owner", "writer role"])
def test_postgresql_publish_says_so_when_another_writer_took_its_idempotency_key(
    database_url: str, pg_writer_role: str, as_writer: bool
) -> None:
    outcomes = {}
    with psycopg.connect(database_url) as conn:
        if as_writer:
            conn.execute(f'SET ROLE "{pg_writer_role}"')
        for n, ((topic, key), _) in enumerate(TAKEN_BY):
            # The other writer, first: plain SQL, as any writer of the table may.
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, idempotency_key) VALUES (%s, %s, '{\"x\": 0}', %s)",
                (topic, key, f"order-{n}"),
            )
            try:
                producers.publish(conn, "orders", {"x": 1}, key="o-1", idempotency_key=f"order-{n}")
                outcomes[(topic, key)] = False
            except producers.IdempotencyKeyTaken as exc:
                assert f"order-{n}" in str(exc)
                outcomes[(topic, key)] = True
        # Neither written nor failed: the caller's transaction goes on.
        conn.execute("INSERT INTO outbox (topic, payload) VALUES ('after', '{}')")
        conn.commit()
    assert outcomes == dict(TAKEN_BY)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (len(TAKEN_BY) + 1,)


def test_postgresql_apublish_says_so_too(database_url: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await conn.execute("INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('payments', '{}', 'k1')")
            with pytest.raises(producers.IdempotencyKeyTaken):
                await producers.apublish(conn, "orders", {}, idempotency_key="k1")
            assert await producers.apublish(conn, "payments", {"other": "payload"}, idempotency_key="k1") == "k1"

    asyncio.run(main())


@pytest.mark.parametrize("as_writer", [False, True], ids=["owner", "writer role"])
def test_mariadb_publish_says_so_when_another_writer_took_its_idempotency_key(
    mysql_url: str, mysql_writer_url: str, as_writer: bool
) -> None:
    outcomes = {}
    conn = mysql_support.connect(mysql_writer_url if as_writer else mysql_url, autocommit=False)
    try:
        for n, ((topic, key), _) in enumerate(TAKEN_BY):
            with conn.cursor() as cur:  # the other writer, first
                cur.execute(mysql_support.INSERT_EVENT, (topic, key, '{"x": 0}', f"order-{n}"))
            try:
                producers.publish(conn, "orders", {"x": 1}, key="o-1", idempotency_key=f"order-{n}")
                outcomes[(topic, key)] = False
            except producers.IdempotencyKeyTaken as exc:
                assert f"order-{n}" in str(exc)
                outcomes[(topic, key)] = True
        conn.commit()
    finally:
        conn.close()
    assert outcomes == dict(TAKEN_BY)
    assert mysql_support.execute(mysql_url, "SELECT COUNT(*) FROM outbox") == [(len(TAKEN_BY),)]
