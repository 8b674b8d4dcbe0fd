"""Outbox tables found through search_path, named in mixed case or by reserved words, on real PostgreSQL.

Every name a relay accepts must reach the same table from every command: an
unqualified name is the table search_path leads to, whichever schema that is.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator, Sequence

import psycopg
import pytest

import producers
from relay.config import TableLayout, TableName
from relay.errors import RelayError
from relay.store.migrate import create_roles, migrate
from relay.store.postgres import PostgresStore

#: Schemas a database's search_path may lead to: plain, mixed case, reserved words, not ASCII.
SCHEMAS = ["app", "App", "order", "user", "événements"]


@pytest.fixture
def roles(pg_admin_url: str, empty_database: str) -> Iterator[tuple[str, str]]:
    """A relay role and a writer role, dropped after the test (roles are the cluster's)."""
    suffix = uuid.uuid4().hex[:8]
    names = (f"relay_{suffix}", f"writer_{suffix}")
    yield names
    with psycopg.connect(empty_database, autocommit=True) as conn:
        for role in names:
            conn.execute(f'DROP OWNED BY "{role}"')  # its grants in the test's database
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for role in names:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def _on_search_path(url: str, schema: str, *, then: Sequence[str] = ()) -> None:
    """Create ``schema`` and make it (and ``then``) the database's search_path, for the sessions opened from now on."""
    path = psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, (schema, *then)))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(schema)))
        database = psycopg.sql.Identifier(conn.info.dbname)
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET search_path = {}").format(database, path))


@pytest.mark.parametrize("schema", SCHEMAS)
def test_create_roles_grants_the_schema_search_path_leads_to(
    empty_database: str, roles: tuple[str, str], schema: str
) -> None:
    _on_search_path(empty_database, schema)
    table = TableName.parse("outbox")
    migrate(empty_database, table)
    relay_role, writer_role = roles
    create_roles(empty_database, table, relay_role=relay_role, writer_role=writer_role)

    with psycopg.connect(empty_database) as conn:
        found = "SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        assert conn.execute(found + " WHERE c.oid = 'outbox'::regclass").fetchone() == (schema,)
        conn.execute(psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(writer_role)))
        key = producers.publish(conn, "t", {"n": 1})
        conn.execute(psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(relay_role)))
        assert conn.execute("SELECT idempotency_key FROM outbox").fetchall() == [(key,)]
        assert conn.execute("SELECT max(version) FROM outbox_schema_version").fetchone() is not None
        conn.rollback()


#: (search_path schema or None, the name migrate is given, the name the relay is given): one table, two spellings.
SPELLINGS = [
    (None, "outbox", "public.outbox"),
    (None, "public.outbox", "outbox"),
    ("app", "outbox", "app.outbox"),
    ("app", "app.outbox", "outbox"),
    ("App", "App.Outbox", "Outbox"),
    ("order", "user", "order.user"),
    ("s" * 63, "s" * 63 + ".outbox", "outbox"),
]


@pytest.mark.parametrize(("schema", "migrated_as", "relayed_as"), SPELLINGS)
def test_a_relay_hears_the_notify_of_its_table_however_it_is_spelled(
    empty_database: str, schema: str | None, migrated_as: str, relayed_as: str
) -> None:
    if schema is not None:
        _on_search_path(empty_database, schema)
    migrate(empty_database, TableName.parse(migrated_as))

    async def woken() -> bool:
        store = PostgresStore(empty_database, TableName.parse(relayed_as), owner="t", lease_seconds=30)
        await store.open()
        try:
            with psycopg.connect(empty_database) as conn:
                producers.publish(conn, "t", {"n": 1}, table=relayed_as)
            return await store.wait(5.0)
        finally:
            await store.close()

    assert asyncio.run(woken())


@pytest.mark.parametrize("schema", SCHEMAS)
def test_migrate_again_with_another_schema_first_on_search_path_upgrades_the_table_it_finds(
    empty_database: str, schema: str
) -> None:
    migrate(empty_database, TableName.parse("outbox"))
    _on_search_path(empty_database, schema, then=["public"])

    assert migrate(empty_database, TableName.parse("outbox")) == []
    with psycopg.connect(empty_database) as conn:
        shadows = conn.execute(
            "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            [schema],
        ).fetchall()
    assert shadows == []


#: (a table, the search_path another is migrated under, that other's name): never one channel for the two.
#: Tables in public are migrated by their bare name.
TWO_TABLES = [
    ("s" * 55 + ".outbox_a", None, "s" * 55 + ".outbox_b"),
    ("public.outbox", "app", "outbox"),
    ("public.Outbox", "App", "Outbox"),
    ("public.outbox", "é" * 30, "outbox"),
    ("public." + "t" * 45, "u" * 30, "t" * 45),
]


@pytest.mark.parametrize(("first", "schema", "second"), TWO_TABLES)
def test_two_tables_never_share_a_notify_channel(
    empty_database: str, first: str, schema: str | None, second: str
) -> None:
    migrate(empty_database, TableName.parse(first.removeprefix("public.")))  # found through search_path
    if schema is not None:
        _on_search_path(empty_database, schema)
    migrate(empty_database, TableName.parse(second))

    async def woken(by: str) -> bool:
        store = PostgresStore(empty_database, TableName.parse(first), owner="t", lease_seconds=30)
        await store.open()
        try:
            with psycopg.connect(empty_database) as conn:
                producers.publish(conn, "t", {"n": 1}, table=by)
            return await store.wait(1.0)
        finally:
            await store.close()

    assert not asyncio.run(woken(by=second))
    assert asyncio.run(woken(by=first))


#: (layout, suffix): the relations migrate names after the table, each kept by CREATE ... IF NOT EXISTS if there.
TAKEN_NAMES = [
    *(("native", suffix) for suffix in ("claim_idx", "key_idx", "failed_idx")),
    *(("debezium", suffix) for suffix in ("claim_idx", "key_idx", "failed_idx", "relay_seq_idx", "relay_seq")),
]


@pytest.mark.parametrize(("layout", "suffix"), TAKEN_NAMES)
@pytest.mark.parametrize("name", ["vv", "order", "App.Vv"])
def test_migrate_refuses_a_table_whose_index_name_another_relation_holds(
    empty_database: str, layout: str, suffix: str, name: str
) -> None:
    table = TableName.parse(name)
    taken = table.derived(suffix)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        if table.schema:
            conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(table.schema)))
        taken_id = psycopg.sql.Identifier(*table.parts[:-1], taken)
        conn.execute(psycopg.sql.SQL("CREATE TABLE {} (x int)").format(taken_id))

    with pytest.raises(RelayError, match=re.escape(taken)) as refused:
        migrate(empty_database, table, layout=TableLayout.parse(layout))
    assert "\n" not in str(refused.value)
    with psycopg.connect(empty_database) as conn:
        quoted = psycopg.sql.Identifier(*table.parts).as_string(conn)
        assert conn.execute("SELECT to_regclass(%s)", [quoted]).fetchone() == (None,)
