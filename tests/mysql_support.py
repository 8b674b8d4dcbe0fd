"""Helpers for tests on MySQL 8 / MariaDB: a database per test, plain SQL through PyMySQL."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pymysql

from relay.store.mysql import Target


def connect(url: str, **kw: Any) -> pymysql.connections.Connection[Any]:
    """A PyMySQL connection to ``url`` (autocommit unless told otherwise), in UTC."""
    target = Target.parse(url) if "/" in url.split("://", 1)[1] else None
    host_url = url if target else url + "/mysql"
    target = target or Target.parse(host_url)
    conn = pymysql.connect(
        host=target.host,
        port=target.port,
        user=target.user,
        password=target.password_bytes,
        database=target.database,
        charset=kw.pop("charset", "utf8mb4"),
        autocommit=kw.pop("autocommit", True),
        **kw,
    )
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
    return conn


def execute(url: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement in its own autocommitted session; its rows."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall())
    finally:
        conn.close()


#: An application's plain-SQL event: topic, key, payload (JSON text) and idempotency key.
INSERT_EVENT = "INSERT INTO outbox (topic, `key`, payload, idempotency_key) VALUES (%s, %s, %s, %s)"


def insert_many(url: str, statement: str, rows: list[tuple[Any, ...]]) -> None:
    """Run ``statement`` once per row in one autocommitted session, as an application's plain SQL would."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.executemany(statement, rows)
    finally:
        conn.close()


@contextlib.contextmanager
def mysql_database(server_url: str) -> Iterator[str]:
    """A new database ``relay_test_<hex>`` on the server of ``server_url``; dropped afterwards."""
    name = f"relay_test_{uuid.uuid4().hex[:12]}"
    execute(server_url, f"CREATE DATABASE `{name}`")
    try:
        yield f"{server_url}/{name}"
    finally:
        execute(server_url, f"DROP DATABASE IF EXISTS `{name}`")


def outbox_counts(url: str, table: str = "outbox") -> dict[str, int]:
    """Rows per state."""
    return {state: int(n) for state, n in execute(url, f"SELECT state, COUNT(*) FROM `{table}` GROUP BY state")}


def migrate_up_to(url: str, version: int) -> list[int]:
    """Apply the migrations of ``outbox`` up to ``version`` by hand, as ``migrate`` records them; their versions.

    Not by patching ``relay.store.mysql.sql.migrations``: the fixtures migrate other tests' databases in
    threads meanwhile, with the same module (one was left at version 1, and a later test failed on it).
    """
    from relay.config import TableName
    from relay.store.mysql import sql as named

    table = TableName.parse("outbox")
    execute(
        url,
        "CREATE TABLE IF NOT EXISTS outbox_schema_version (version INT NOT NULL PRIMARY KEY,"
        " name VARCHAR(200) NOT NULL, applied_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))) ENGINE = InnoDB",
    )
    applied = []
    for step in named.migrations():
        if step.version > version:
            break
        for statement in named.statements(named.render(step.template, table)):
            execute(url, statement)
        execute(url, "INSERT INTO outbox_schema_version (version, name) VALUES (%s, %s)", (step.version, step.name))
        applied.append(step.version)
    return applied
