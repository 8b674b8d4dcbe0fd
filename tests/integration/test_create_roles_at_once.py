"""migrate --create-roles run at once for several tables or databases: roles are the cluster's."""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Sequence

import psycopg

from relay.config import TableName
from relay.store.migrate import create_roles, migrate


def at_once(calls: Sequence[Callable[[], None]]) -> list[BaseException]:
    """Run ``calls`` in threads released together; the exceptions they raised."""
    start, errors = threading.Barrier(len(calls)), []

    def run(call: Callable[[], None]) -> None:
        start.wait()
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def drop_roles(admin_url: str, databases: list[str], roles: list[str]) -> None:
    for url in databases:
        with psycopg.connect(url, autocommit=True) as conn:
            for role in roles:
                conn.execute(f'DROP OWNED BY "{role}"')
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in roles:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_two_tables_of_one_database_and_two_databases_at_once(
    pg_admin_url: str, database_url: str, empty_database: str
) -> None:
    tables = [TableName.parse(f"roles_{n}") for n in range(3)]
    for table in tables:
        migrate(database_url, table)
    migrate(empty_database, TableName.parse("outbox"))
    for _ in range(3):
        suffix = uuid.uuid4().hex[:8]
        relay, writer = f"r_{suffix}", f"w_{suffix}"
        targets = [(database_url, table) for table in tables] + [(empty_database, TableName.parse("outbox"))]
        calls = [
            functools.partial(create_roles, url, table, relay_role=relay, writer_role=writer) for url, table in targets
        ]
        try:
            assert at_once(calls) == []
            with psycopg.connect(database_url) as conn:
                for table in tables:
                    granted = conn.execute(
                        "SELECT has_table_privilege(%s, %s, 'DELETE'),"
                        " has_column_privilege(%s, %s, 'payload', 'INSERT')",
                        [relay, str(table), writer, str(table)],
                    ).fetchone()
                    assert granted == (True, True)
        finally:
            drop_roles(pg_admin_url, [database_url, empty_database], [relay, writer])
