"""Schema and migrations on real MariaDB (MySQL 8 dialect): the same checks as on PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pymysql
import pytest

import producers
from relay.config import TableName
from relay.errors import SchemaError
from relay.store.mysql import MySQLStore, Target
from relay.store.mysql import sql as named
from relay.store.mysql.admin import NO_LEASE
from relay.store.mysql.migrate import create_roles, migrate, schema_version
from tests import mysql_support

CATALOG = {
    "columns": """
        SELECT table_name, column_name, column_type, is_nullable, column_default, character_set_name,
               collation_name, extra
        FROM information_schema.columns WHERE table_schema = DATABASE() ORDER BY 1, 2""",
    "indexes": """
        SELECT table_name, index_name, seq_in_index, column_name, non_unique, collation
        FROM information_schema.statistics WHERE table_schema = DATABASE() ORDER BY 1, 2, 3""",
    "checks": """
        SELECT constraint_name, check_clause FROM information_schema.check_constraints
        WHERE constraint_schema = DATABASE() ORDER BY 1""",
    "triggers": """
        SELECT trigger_name, event_manipulation, action_timing, action_statement FROM information_schema.triggers
        WHERE trigger_schema = DATABASE() ORDER BY 1""",
    "routines": """
        SELECT routine_name, routine_type, data_type, routine_definition, security_type, sql_data_access
        FROM information_schema.routines WHERE routine_schema = DATABASE() ORDER BY 1""",
    "tables": """
        SELECT table_name, engine, table_collation FROM information_schema.tables
        WHERE table_schema = DATABASE() ORDER BY 1""",
}


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    return {name: mysql_support.execute(url, query) for name, query in CATALOG.items()}


def test_migrations_and_schema_sql_build_the_same_schema(mysql_url: str, mysql_server_url: str) -> None:
    table = TableName.parse("outbox")
    with mysql_support.mysql_database(mysql_server_url) as other:
        for statement in named.statements(named.render(named.schema_template(), table)):
            mysql_support.execute(other, statement)
        assert catalog(other) == catalog(mysql_url)
        assert catalog(other)["columns"]  # the comparison compared something
        assert schema_version(other, table) == schema_version(mysql_url, table) == len(named.migrations())


def test_migrate_is_idempotent_and_safe_when_two_run_at_once(mysql_empty_url: str) -> None:
    table = TableName.parse("outbox")
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(migrate(mysql_empty_url, table))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(results) == [[], [], [1, 2, 3, 4, 5, 6, 7]]
    assert migrate(mysql_empty_url, table) == []
    assert mysql_support.execute(mysql_empty_url, "SELECT version, name FROM outbox_schema_version ORDER BY 1") == [
        (1, "initial"),
        (2, "bytes_payloads"),
        (3, "topic_check"),
        (4, "length_checks"),
        (5, "writer_bounds"),
        (6, "same_event"),
        (7, "fixed_width_lease"),
    ]


@pytest.mark.parametrize("database_chars", [23, 60], ids=["short", "long"])
def test_two_spellings_of_one_table_migrated_at_once_take_one_lock(mysql_server_url: str, database_chars: int) -> None:
    # `outbox` with a URL to the database, and `database.outbox`: one table, so one migration at a time. Keyed on
    # the spelling, the two ran the same steps side by side (error 1060, duplicate column). 60 characters make
    # the lock's name longer than GET_LOCK takes.
    database = f"relay_test_{uuid.uuid4().hex}"[:database_chars].ljust(database_chars, "x")
    mysql_support.execute(mysql_server_url, f"CREATE DATABASE `{database}`")
    url = f"{mysql_server_url}/{database}"
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def one(spelling: str) -> None:
        try:
            results.append(migrate(url, TableName.parse(spelling)))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    try:
        for round in range(3):
            name = f"outbox_{round}"
            results.clear()
            threads = [threading.Thread(target=one, args=(s,)) for s in [name, f"{database}.{name}"] * 3]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert errors == []
            assert sorted(results) == [[]] * 5 + [[1, 2, 3, 4, 5, 6, 7]]
    finally:
        mysql_support.execute(mysql_server_url, f"DROP DATABASE IF EXISTS `{database}`")


def test_a_table_in_another_database_is_created_there(mysql_empty_url: str, mysql_server_url: str) -> None:
    database = mysql_empty_url.rsplit("/", 1)[1] + "_events"
    try:
        assert migrate(mysql_empty_url, TableName.parse(f"{database}.outbox")) == [1, 2, 3, 4, 5, 6, 7]
        rows = mysql_support.execute(mysql_empty_url, f"SELECT COUNT(*) FROM `{database}`.`outbox`")
        assert rows == [(0,)]
    finally:
        mysql_support.execute(mysql_server_url, f"DROP DATABASE IF EXISTS `{database}`")


def test_a_missing_table_is_a_schema_error(mysql_empty_url: str) -> None:
    store = MySQLStore(mysql_empty_url, TableName.parse("outbox"), owner="t", lease_seconds=30)
    with pytest.raises(SchemaError, match="outbox-relay migrate"):
        asyncio.run(store.open())


def test_plain_sql_with_the_key_in_backticks_gets_the_defaults_in_utc(mysql_url: str) -> None:
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            # A writer whose session is not in UTC: the defaults are UTC all the same.
            cur.execute("SET SESSION time_zone = '+05:00'")
            cur.execute("INSERT INTO outbox (topic, `key`, payload) VALUES ('orders', 'order-42', '{\"n\": 1}')")
            cur.execute(
                "SELECT TIMESTAMPDIFF(SECOND, created_at, UTC_TIMESTAMP(6)), TIMESTAMPDIFF(SECOND, deliver_at,"
                " UTC_TIMESTAMP(6)), state, headers, idempotency_key <> '' FROM outbox"
            )
            created, deliver, state, headers, has_idem = cur.fetchone()
    finally:
        conn.close()
    assert abs(created) <= 2 and abs(deliver) <= 2
    assert (state, headers, has_idem) == ("pending", "{}", 1)


@pytest.mark.parametrize(
    "values",
    [
        "('', NULL, '{}', '{}', NULL, NULL)",  # empty topic
        "('t', NULL, '{}', '[]', NULL, NULL)",  # headers not an object
        "('t', NULL, 'not json', '{}', NULL, NULL)",
        "('t', NULL, NULL, '{}', NULL, NULL)",  # no payload at all
        "('t', NULL, '{}', '{}', X'00', 'a/b')",  # both forms
        "('t', NULL, '{}', '{}', NULL, 'a/b')",  # a content type on a JSON event
        "('t', NULL, NULL, '{}', X'00', NULL)",  # bytes without a content type
        "('t', NULL, NULL, '{}', X'00', '')",  # an empty content type
        "('t', NULL, NULL, '{}', X'00', REPEAT('é', 128))",  # 256 bytes: too long, though 128 characters
    ],
)
def test_the_checks_refuse_bad_rows(mysql_url: str, values: str) -> None:
    with pytest.raises(pymysql.err.MySQLError):
        mysql_support.execute(
            mysql_url,
            f"INSERT INTO outbox (topic, `key`, payload, headers, payload_bytes, content_type) VALUES {values}",
        )
    assert mysql_support.execute(mysql_url, "SELECT COUNT(*) FROM outbox") == [(0,)]


def test_the_checks_take_a_bytes_row_with_a_content_type_of_255_bytes(mysql_url: str) -> None:
    content_type = "é" * 127 + "c"  # 255 bytes of UTF-8
    mysql_support.execute(
        mysql_url,
        "INSERT INTO outbox (topic, payload_bytes, content_type) VALUES ('t', X'', %s), ('t', X'80ff', ' ')",
        [content_type],
    )
    rows = mysql_support.execute(mysql_url, "SELECT payload, payload_bytes, content_type FROM outbox ORDER BY id")
    assert rows == [(None, b"", content_type), (None, b"\x80\xff", " ")]


def test_migrate_upgrades_a_table_of_the_first_version_and_keeps_its_events(mysql_empty_url: str) -> None:
    table = TableName.parse("outbox")
    assert mysql_support.migrate_up_to(mysql_empty_url, 1) == [1]
    mysql_support.execute(
        mysql_empty_url, "INSERT INTO outbox (topic, `key`, payload) VALUES ('t', 'k', '{\"n\": 1}'), ('t', NULL, '[]')"
    )
    assert migrate(mysql_empty_url, table) == [2, 3, 4, 5, 6, 7]
    assert schema_version(mysql_empty_url, table) == 7
    conn = mysql_support.connect(mysql_empty_url, autocommit=False)
    try:
        producers.publish(conn, "t", b"\x00\xff", key="k", content_type="a/b", idempotency_key="raw")
        conn.commit()
    finally:
        conn.close()
    store = MySQLStore(mysql_empty_url, table, owner="t", lease_seconds=30)

    async def claim() -> list[tuple[str | None, bytes, str | None]]:
        await store.open()
        try:
            return [(e.key, e.payload, e.content_type) for e in (await store.claim(10, max_attempts=3)).events]
        finally:
            await store.close()

    assert asyncio.run(claim()) == [("k", b'{"n": 1}', None), (None, b"[]", None), ("k", b"\x00\xff", "a/b")]


def test_keys_and_idempotency_keys_compare_byte_for_byte(mysql_url: str) -> None:
    for key, idem in (("A", "x"), ("a", "X"), ("a ", "x ")):
        mysql_support.execute(
            mysql_url,
            "INSERT INTO outbox (topic, `key`, payload, idempotency_key) VALUES ('t', %s, '{}', %s)",
            [key, idem],
        )
    assert mysql_support.execute(mysql_url, "SELECT COUNT(DISTINCT `key`), COUNT(*) FROM outbox") == [(3, 3)]


@pytest.mark.parametrize("tails", [0, 1000], ids=["no tails", "1000 tail keys"])
def test_the_claim_reads_the_claim_index(mysql_url: str, tails: int) -> None:
    for i in range(200):
        mysql_support.execute(mysql_url, "INSERT INTO outbox (topic, payload) VALUES ('t', %s)", [f'{{"i": {i}}}'])
    mysql_support.execute(mysql_url, "ANALYZE TABLE outbox")
    query = named.render(named.queries()["claim_candidates"], TableName.parse("outbox"))
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            tail_keys = tuple(f"k{i}".encode() for i in range(tails)) or (b"",)
            params = {"max_attempts": 3, "limit": 10, "inline_bytes": 4096, "tailed": tails > 0, "tail_keys": tail_keys}
            cur.execute("EXPLAIN " + query, params)
            names = [c[0] for c in cur.description]
            plan = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        conn.close()
    outer = plan[0]
    assert outer["table"] == "o" and outer["key"] == "outbox_claim_idx", plan
    assert "filesort" not in (outer["Extra"] or "").lower(), plan


def _claim_once(
    mysql_url: str, rows: list[tuple[str, str, str]], limit: int, tail_keys: tuple[bytes, ...] = ()
) -> tuple[list[Any], dict[str, int]]:
    """The rows of one locking read of the claim over ``rows`` (rolled back), and the session's counters."""
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", rows)
            conn.commit()
            query = named.render(named.queries()["claim_candidates"], TableName.parse("outbox"))
            params = {
                "max_attempts": 3,
                "limit": limit,
                "inline_bytes": 4096,
                "tailed": bool(tail_keys),
                "tail_keys": tail_keys or (b"",),
            }
            cur.execute("FLUSH STATUS")
            cur.execute(query, params)
            claimed = list(cur.fetchall())
            conn.rollback()
            cur.execute(
                "SHOW SESSION STATUS WHERE Variable_name LIKE 'Handler_read_%' OR Variable_name LIKE 'Subquery_cache_%'"
            )
            counters = {name: int(value) for name, value in cur.fetchall()}
    finally:
        conn.close()
    return claimed, counters


def test_the_claim_reads_a_few_index_entries_per_candidate_whatever_the_events_per_key(mysql_url: str) -> None:
    # A correlated MIN() or MAX() reads every event of the key, where ORDER BY id LIMIT 1 stops at the
    # first: over 4 keys of 300 events each, the claim of 100 read 32,308 index entries (issue 39).
    claimed, counters = _claim_once(mysql_url, [("t", f"k{i % 4}", f'{{"i": {i}}}') for i in range(1200)], limit=100)
    reads = sum(
        value
        for name, value in counters.items()
        if name.startswith("Handler_read_") and name != "Handler_read_rnd_next"
    )
    assert len(claimed) == 100
    assert reads < 20 * len(claimed), reads


@pytest.mark.parametrize("dead_letters", [0, 1], ids=["no dead letter", "a dead letter of another key"])
def test_the_claim_probes_a_head_of_its_key_twice_and_its_dead_letters_only_while_there_are_any(
    mysql_url: str, dead_letters: int
) -> None:
    # A candidate that is its key's oldest unsent event costs the WHERE's probe of its key's first pending event
    # and the head column's (the same again: MariaDB's subquery cache does not share it with the WHERE's); the
    # probe of its key's first dead letter only while the table has one (an uncorrelated NOT EXISTS, one read a
    # statement). The head column repeated both of the WHERE's probes before: 4 per candidate, then 3.
    if dead_letters:
        mysql_support.execute(
            mysql_url, "INSERT INTO outbox (topic, `key`, payload, state) VALUES ('t', 'x', '{}', 'failed')"
        )
    claimed, counters = _claim_once(mysql_url, [("t", f"k{i}", f'{{"i": {i}}}') for i in range(400)], limit=200)
    heads = [row[-1] for row in claimed]
    # Handler_read_key counts MariaDB's subquery cache's lookups too (one a subquery evaluated, while the cache is on).
    probes = (
        counters["Handler_read_key"] - counters.get("Subquery_cache_hit", 0) - counters.get("Subquery_cache_miss", 0)
    )
    assert heads == [1] * 200
    assert probes <= (3 if dead_letters else 2) * len(heads) + 2, counters
    assert probes > (3 if dead_letters else 2) * len(heads) - 2, counters  # the switch: no probe skipped with one


def test_the_claim_does_not_probe_the_head_of_a_key_it_goes_on_with(mysql_url: str) -> None:
    # A key of this relay's tails passes the WHERE by its tail, and its runs go on after it: no probe at all.
    tails = tuple(f"k{i}".encode() for i in range(200))
    claimed, counters = _claim_once(
        mysql_url, [("t", f"k{i}", f'{{"i": {i}}}') for i in range(200)], limit=200, tail_keys=tails
    )
    assert len(claimed) == 200 and {row[-1] for row in claimed} == {None}
    assert counters["Handler_read_key"] <= 2, counters


def test_create_roles_grants_the_least_each_role_needs_and_can_run_again(mysql_url: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    relay_role, writer_role = f"relay_t_{suffix}", f"writer_t_{suffix}"
    table = TableName.parse("outbox")
    try:
        for _ in range(2):
            create_roles(mysql_url, table, relay_role=relay_role, writer_role=writer_role)
        grants = {
            role: " ".join(row[0] for row in mysql_support.execute(mysql_url, f"SHOW GRANTS FOR `{role}`"))
            for role in (relay_role, writer_role)
        }
    finally:
        for role in (relay_role, writer_role):
            mysql_support.execute(mysql_url, f"DROP ROLE IF EXISTS `{role}`")
    relay, writer = grants[relay_role], grants[writer_role]
    assert "SELECT" in relay and "DELETE" in relay and "UPDATE (" in relay and "`claim_token`" in relay
    assert "outbox_schema_version" in relay
    assert "INSERT (" in writer and "DELETE" not in writer and "`claim_token`" not in writer
    assert "`payload_bytes`" in writer and "`content_type`" in writer
    assert "INSERT" not in relay


def test_a_user_with_the_writer_role_publishes_bytes_and_json_and_no_relay_column(mysql_url: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    relay_role, writer_role, user, password = f"relay_t_{suffix}", f"writer_t_{suffix}", f"app_{suffix}", suffix * 2
    target = Target.parse(mysql_url)
    try:
        create_roles(mysql_url, TableName.parse("outbox"), relay_role=relay_role, writer_role=writer_role)
        mysql_support.execute(mysql_url, f"CREATE USER `{user}`@'%' IDENTIFIED BY '{password}'")  # hex digits
        mysql_support.execute(mysql_url, f"GRANT `{writer_role}` TO `{user}`@'%'")
        mysql_support.execute(mysql_url, f"SET DEFAULT ROLE `{writer_role}` FOR `{user}`@'%'")
        conn = mysql_support.connect(
            f"mysql://{user}:{password}@{target.host}:{target.port}/{target.database}", autocommit=False
        )
        try:
            producers.publish(conn, "t", {"json": 1}, idempotency_key="json")
            producers.publish(conn, "t", b"\xc3\x28", content_type="a/b", idempotency_key="raw")
            producers.publish(conn, "t", {"json": 2}, idempotency_key="json")  # a duplicate: written once
            conn.commit()
            for refused in (
                "INSERT INTO outbox (topic, payload, state) VALUES ('t', '{}', 'sent')",
                "UPDATE outbox SET payload_bytes = X'00' WHERE id > 0",
            ):
                with conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError, match="denied"):
                    cur.execute(refused)
        finally:
            conn.close()
        rows = mysql_support.execute(
            mysql_url, "SELECT idempotency_key, payload, payload_bytes, content_type FROM outbox ORDER BY id"
        )
        assert rows == [(b"json", '{"json": 1}', None, None), (b"raw", None, b"\xc3\x28", "a/b")]
    finally:
        mysql_support.execute(mysql_url, f"DROP USER IF EXISTS `{user}`@'%'")
        for role in (relay_role, writer_role):
            mysql_support.execute(mysql_url, f"DROP ROLE IF EXISTS `{role}`")


@pytest.mark.parametrize("topic", [" ", "  ", "\t", "\u00a0", "a "])
def test_a_topic_of_spaces_is_taken_as_on_postgresql_and_an_empty_one_refused(mysql_url: str, topic: str) -> None:
    """Under the PAD SPACE collation `topic <> ''` took ' ' for '' (migration 0003 counts bytes instead)."""
    mysql_support.execute(mysql_url, "INSERT INTO outbox (topic, payload) VALUES (%s, '{}')", [topic])
    assert mysql_support.execute(mysql_url, "SELECT topic FROM outbox") == [(topic,)]
    with pytest.raises(Exception, match="topic_check"):
        mysql_support.execute(mysql_url, "INSERT INTO outbox (topic, payload) VALUES ('', '{}')")


def test_the_fixed_width_lease_keeps_the_leases_held_and_frees_the_rest(mysql_empty_url: str) -> None:
    # Migration 0007 on a table in use: a live lease stays (its owner goes), a row never leased and one
    # whose lease was given back become "no lease", and the store claims those and only those.
    table = TableName.parse("outbox")
    token = str(uuid.uuid4())
    assert mysql_support.migrate_up_to(mysql_empty_url, 6) == [1, 2, 3, 4, 5, 6]
    mysql_support.execute(
        mysql_empty_url,
        "INSERT INTO outbox (topic, `key`, payload, idempotency_key, claim_token, lease_owner, lease_expires_at,"
        " attempts) VALUES ('t', 'a', '{}', 'held', %s, 'host:1', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 1),"
        " ('t', 'b', '{}', 'free', NULL, NULL, NULL, 0), ('t', 'c', '{}', 'given-back', NULL, NULL, NULL, 2)",
        (token,),
    )
    assert migrate(mysql_empty_url, table) == [7]
    rows = mysql_support.execute(
        mysql_empty_url,
        "SELECT idempotency_key, claim_token, lease_owner, lease_expires_at > UTC_TIMESTAMP(6), lease_expires_at"
        " FROM outbox ORDER BY id",
    )
    held, free, given_back = rows
    assert held[:4] == (b"held", token, "", 1)
    assert free[1:] == given_back[1:] == ("", "", 0, NO_LEASE)
    store = MySQLStore(mysql_empty_url, table, owner="o" * 200, lease_seconds=30)

    async def claim() -> list[tuple[str, int]]:
        await store.open()
        try:
            return [(e.idempotency_key, e.attempts) for e in (await store.claim(10, max_attempts=3)).events]
        finally:
            await store.close()

    assert asyncio.run(claim()) == [("free", 1), ("given-back", 3)]
    # A long owner is cut to the column's 80 characters, and a claim leases nothing it did not choose.
    owners = mysql_support.execute(mysql_empty_url, "SELECT lease_owner FROM outbox ORDER BY id")
    assert owners == [("",), ("o" * 80,), ("o" * 80,)]
