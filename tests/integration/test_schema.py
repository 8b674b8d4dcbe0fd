"""Schema, migrations and the claim query's plan, on real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from relay.config import TableName
from relay.errors import SchemaError
from relay.store import sql as named
from relay.store.migrate import migrate, schema_version

CATALOG = {
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2""",
    "constraints": """
        SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace ORDER BY 1""",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
    "triggers": "SELECT tgname, pg_get_triggerdef(oid), tgenabled FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1",
    "functions": """
        SELECT proname, pg_get_functiondef(oid) FROM pg_proc
        WHERE pronamespace = 'public'::regnamespace ORDER BY 1""",
    "options": "SELECT relname, reloptions FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY 1",
}


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(query).fetchall() for name, query in CATALOG.items()}


def test_migrations_and_schema_sql_build_the_same_schema(database_url: str, empty_database: str) -> None:
    table = TableName.parse("outbox")
    with psycopg.connect(empty_database, autocommit=True) as conn:
        # migrate names the table by the schema search_path finds it in (its NOTIFY channel says so)
        conn.execute(named.render(named.schema_template(), TableName.parse("public.outbox")))
    assert catalog(database_url) == catalog(empty_database)
    assert schema_version(empty_database, table) == schema_version(database_url, table) == len(named.migrations())


def test_migrate_is_idempotent_and_safe_when_two_run_at_once(empty_database: str) -> None:
    table = TableName.parse("events.outbox")
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(migrate(empty_database, table))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results, key=len) == [[], [], [m.version for m in named.migrations()]]
    assert migrate(empty_database, table) == []
    with psycopg.connect(empty_database) as conn:
        conn.execute("INSERT INTO events.outbox (topic, payload) VALUES ('t', '{}')")
        assert conn.execute("SELECT count(*) FROM events.outbox").fetchone() == (1,)


@pytest.mark.parametrize("schema", ["public", "events"])
def test_two_spellings_of_one_table_migrated_at_once_take_one_lock(empty_database: str, schema: str) -> None:
    # `outbox` and `public.outbox` are one table (so is `events.outbox` with search_path events): one migration at
    # a time. Keyed on the spelling, the two ran side by side and one failed (a duplicate key in pg_type).
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET search_path = {schema}")
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def one(spelling: str) -> None:
        try:
            results.append(migrate(empty_database, TableName.parse(spelling)))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    for round in range(3):
        name = f"outbox_{round}"
        results.clear()
        threads = [threading.Thread(target=one, args=(s,)) for s in [name, f"{schema}.{name}"] * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sorted(results, key=len) == [[]] * 5 + [[m.version for m in named.migrations()]]


def test_a_table_from_an_older_version_is_upgraded_with_its_rows(empty_database: str) -> None:
    table = TableName.parse("outbox")
    first, *later = named.migrations()
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE outbox_schema_version (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(named.render(first.template, table))
        conn.execute("INSERT INTO outbox_schema_version (version, name) VALUES (1, 'initial')")
        conn.execute("""INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{"traceparent": "x"}')""")

    assert migrate(empty_database, table) == [m.version for m in later]

    with psycopg.connect(empty_database, autocommit=True) as conn:
        assert conn.execute("SELECT headers FROM outbox").fetchall() == [({"traceparent": "x"},)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("""INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{"a": 1}')""")


def test_notify_trigger_can_be_switched_off_and_on(database_url: str) -> None:
    table = TableName.parse("outbox")

    def enabled() -> str:
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SELECT tgenabled FROM pg_trigger WHERE tgname = 'outbox_notify'").fetchone()
            assert row is not None
            return str(row[0])

    assert enabled() == "O"
    migrate(database_url, table, notify=False)
    assert enabled() == "D"
    migrate(database_url, table, notify=True)
    assert enabled() == "O"


def test_the_schema_rejects_what_it_must(database_url: str) -> None:
    bad = [
        "INSERT INTO outbox (topic, payload) VALUES (NULL, '{}')",
        "INSERT INTO outbox (topic, payload) VALUES ('', '{}')",
        "INSERT INTO outbox (topic, payload) VALUES ('t', NULL)",
        "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '[1]')",
        "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"a\": 1}')",
        "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', NULL)",
        "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"a\": \"x\", \"b\": null}')",
        "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"\": \"x\"}')",
        "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '\"text\"')",
        "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"a\": [\"x\"]}')",
        "INSERT INTO outbox (topic, payload) VALUES ('t', 'not json')",
        "INSERT INTO outbox (topic, payload, state) VALUES ('t', '{}', 'bogus')",
        "INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('t', '{}', '')",
        # exactly one payload form, and a content type with bytes only
        "INSERT INTO outbox (topic) VALUES ('t')",
        "INSERT INTO outbox (topic, payload, payload_bytes, content_type) VALUES ('t', '{}', '\\x00', 'a/b')",
        "INSERT INTO outbox (topic, payload, content_type) VALUES ('t', '{}', 'application/json')",
        "INSERT INTO outbox (topic, payload_bytes) VALUES ('t', '\\x00')",
        "INSERT INTO outbox (topic, payload_bytes, content_type) VALUES ('t', '\\x00', '')",
        f"INSERT INTO outbox (topic, payload_bytes, content_type) VALUES ('t', '\\x00', '{'x' * 256}')",
    ]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in bad:
            with pytest.raises(psycopg.Error):
                conn.execute(statement)
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)


def test_a_plain_insert_fills_every_default(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('orders', 'o-1', '{\"n\": 1}')")
        row = conn.execute(
            "SELECT headers, length(idempotency_key), deliver_at <= now(), priority, state, attempts FROM outbox"
        ).fetchone()
    assert row == ({}, 36, True, 0, "pending", 0)


def test_a_plain_insert_of_bytes_keeps_them_exactly(database_url: str) -> None:
    # As docs/bytes.md shows it: payload_bytes and content_type instead of payload.
    raw = bytes(range(256))
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload_bytes, content_type) VALUES ('t', 'k', %s, 'application/x-avro')",
            [raw],
        )
        conn.execute("INSERT INTO outbox (topic, payload_bytes, content_type) VALUES ('t', '\\x00ff', 'a/b')")
        rows = conn.execute("SELECT payload, payload_bytes, content_type FROM outbox ORDER BY id").fetchall()
    assert rows == [(None, raw, "application/x-avro"), (None, b"\x00\xff", "a/b")]


def test_the_bytes_migration_does_not_rewrite_a_table_and_keeps_its_rows(empty_database: str) -> None:
    table = TableName.parse("outbox")
    before = [m for m in named.migrations() if m.version < 4]
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE outbox_schema_version (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for step in before:
            conn.execute(named.render(step.template, table))
            conn.execute("INSERT INTO outbox_schema_version (version, name) VALUES (%s, %s)", [step.version, step.name])
        conn.execute(
            "INSERT INTO outbox (topic, payload) SELECT 't', jsonb_build_object('n', g) FROM generate_series(1, 1000) g"
        )
        file_before = conn.execute("SELECT pg_relation_filenode('outbox')").fetchone()

    assert 4 in migrate(empty_database, table)

    with psycopg.connect(empty_database, autocommit=True) as conn:
        assert conn.execute("SELECT pg_relation_filenode('outbox')").fetchone() == file_before
        assert conn.execute("SELECT count(*) FROM outbox WHERE payload IS NOT NULL").fetchone() == (1000,)
        validated = conn.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'outbox_payload_check'")
        assert validated.fetchone() == (True,)


def test_store_on_a_missing_table_says_to_migrate(empty_database: str) -> None:
    import asyncio

    from relay.store.postgres import PostgresStore

    store = PostgresStore(empty_database, TableName.parse("outbox"), owner="t", lease_seconds=30, listen=False)
    with pytest.raises(SchemaError, match="outbox-relay migrate"):
        asyncio.run(store.open())


def test_the_claim_query_uses_its_index(database_url: str) -> None:
    claim = named.render(named.queries()["claim"], TableName.parse("outbox"))
    with psycopg.connect(database_url) as conn:
        conn.execute(
            """INSERT INTO outbox (topic, key, payload, state)
               SELECT 't', CASE WHEN g % 3 = 0 THEN NULL ELSE 'k' || (g % 500) END, '{}',
                      CASE WHEN g % 10 = 0 THEN 'pending' ELSE 'sent' END
               FROM generate_series(1, 20000) g"""
        )
        conn.execute("ANALYZE outbox")
        plans = []
        # A full scan, one from a keyset hint, and one going on from keys in flight.
        for after, tails in ((0, []), (15000, []), (0, [(f"k{n}", 15000 + n) for n in range(1, 200)])):
            params: dict[str, object] = {
                "after": after,
                "limit": 100,
                "max_bytes": 16 * 2**20,
                "max_attempts": 5,
                "token": None,
                "owner": "x",
                "lease_seconds": 30,
                "mine": [uuid4()],
                "tail_keys": [key for key, _ in tails],
                "tail_ids": [id_ for _, id_ in tails],
                "tail_topics": ["t" for _ in tails],
            }
            plans.append("\n".join(r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ") + claim, params)))
        conn.rollback()
    for plan in plans:
        assert "outbox_claim_idx" in plan, plan
        assert "outbox_key_idx" in plan, plan
        assert "Seq Scan" not in plan, plan


def test_oldest_pending_age_matches_the_naive_query_across_priorities_schedules_and_leases(database_url: str) -> None:
    import asyncio

    from tests.relay_support import opened_store

    with psycopg.connect(database_url) as conn:
        conn.execute(
            """INSERT INTO outbox (topic, payload, priority, created_at, deliver_at, state, lease_expires_at)
               SELECT 't', '{}', g % 3, now() - make_interval(secs => 3001 - g),
                      CASE WHEN g % 7 = 0 THEN now() + interval '1 hour' ELSE now() END,
                      CASE WHEN g % 5 = 0 THEN 'sent' ELSE 'pending' END,
                      -- the oldest are in flight (not pending, so not aged), the next ones' leases expired
                      CASE WHEN g <= 100 THEN now() + interval '1 minute'
                           WHEN g <= 200 THEN now() - interval '1 minute' END
               FROM generate_series(1, 3000) g"""
        )
        naive = conn.execute(
            "SELECT extract(epoch FROM now() - min(created_at)) FROM outbox"
            " WHERE state = 'pending' AND deliver_at <= now()"
            " AND (lease_expires_at IS NULL OR lease_expires_at < now())"
        ).fetchone()
    assert naive is not None

    async def age() -> float:
        async with opened_store(database_url) as store:
            return await store.oldest_pending_age()

    assert abs(asyncio.run(age()) - float(naive[0])) < 1.0
    assert 2899 < float(naive[0]) < 2901  # g = 101: leased ones skipped, an expired lease counted
