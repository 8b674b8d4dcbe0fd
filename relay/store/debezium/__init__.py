"""Debezium's outbox table layout: ``outbox-relay migrate --table-layout debezium``.

The relay reads a Debezium outbox table (``id`` uuid, ``aggregatetype``,
``aggregateid``, ``type``, ``payload``) through a view that gives it the
native table's column names (``{table}_relay``, ``tables.sql``), so every
query of ``queries.sql`` runs on it unchanged. ``migrate`` adds the relay's
own columns (``relay_*``), indexes and trigger to the table (numbered steps
from 1001, beside the native ones), never touching the application's columns
and never rewriting the table, and (re)creates the view for the type of the
``payload`` column. docs/debezium.md has the reasoning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from functools import cache
from typing import LiteralString

import psycopg
from psycopg import sql

from relay.config import DEFAULT_TOPIC_TEMPLATE, TableLayout, TableName
from relay.errors import SchemaError
from relay.store import sql as named

logger = logging.getLogger(__name__)

#: The session setting the view reads the topic template from (the relay sets it on each connection).
TOPIC_TEMPLATE_SETTING = "outbox_relay.topic_template"
#: Debezium's columns the relay needs, and the payload types it relays.
REQUIRED_COLUMNS = ("id", "aggregatetype", "aggregateid", "payload")
#: The view's payload columns for each type of ``payload``: JSON as written
#: (jsonb as PostgreSQL prints it), text as its UTF-8 bytes (``text/plain``: it
#: need not be JSON), bytes as they are. A null payload goes out as an empty
#: value (never a tombstone), with no content type.
PAYLOAD_COLUMNS: dict[str, LiteralString] = {
    "jsonb": "o.payload AS payload, CASE WHEN o.payload IS NULL THEN '\\x'::bytea END AS payload_bytes,"
    " NULL::text AS content_type",
    "json": "o.payload AS payload, CASE WHEN o.payload IS NULL THEN '\\x'::bytea END AS payload_bytes,"
    " NULL::text AS content_type",
    "text": "NULL::jsonb AS payload, convert_to(coalesce(o.payload::text, ''), 'UTF8') AS payload_bytes,"
    " CASE WHEN o.payload IS NOT NULL THEN 'text/plain; charset=utf-8' END AS content_type",
    "bytea": "NULL::jsonb AS payload, coalesce(o.payload, '\\x'::bytea) AS payload_bytes,"
    " CASE WHEN o.payload IS NOT NULL THEN 'application/octet-stream' END AS content_type",
}
PAYLOAD_COLUMNS["character varying"] = PAYLOAD_COLUMNS["text"]
#: jsonb_build_object takes at most 100 arguments: the id and this many columns.
MAX_HEADER_COLUMNS = 49
_STEP_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def identifiers(table: TableName) -> dict[str, sql.Composable]:
    """The placeholders of the layout's SQL, all derived from ``table``."""

    def same_schema(name: str) -> sql.Identifier:
        return sql.Identifier(table.schema, name) if table.schema else sql.Identifier(name)

    seq = table.derived("relay_seq")
    return {
        "table": sql.Identifier(*table.parts),
        "view": sql.Identifier(*TableLayout("debezium").relation(table).parts),
        "version_table": same_schema(table.derived("schema_version")),
        "seq": same_schema(seq),
        "seq_name": sql.Literal(".".join(f'"{part}"' for part in (*table.parts[:-1], seq))),
        "seq_idx": sql.Identifier(table.derived("relay_seq_idx")),
        "claim_idx": sql.Identifier(table.derived("claim_idx")),
        "key_idx": sql.Identifier(table.derived("key_idx")),
        "failed_idx": sql.Identifier(table.derived("failed_idx")),
        "state_check": sql.Identifier(table.derived("relay_check")),
        "notify_func": same_schema(table.derived("notify")),
        "notify_trigger": sql.Identifier(table.derived("notify")),
        "channel": sql.Literal(table.channel),
        "default_template": sql.Literal(DEFAULT_TOPIC_TEMPLATE),
    }


@cache
def steps() -> tuple[named.Migration, ...]:
    """The layout's numbered steps, oldest first (numbered from 1001: a native migrate refuses such a table)."""
    found = []
    for entry in named.package_files("debezium"):
        match = _STEP_RE.match(entry)
        if match:
            found.append(named.Migration(int(match.group(1)), match.group(2), named.read(f"debezium/{entry}")))
    return tuple(sorted(found, key=lambda m: m.version))


@cache
def pieces() -> dict[str, LiteralString]:
    """The named pieces of ``tables.sql``."""
    parts = _NAME_RE.split(named.read("debezium/tables.sql"))
    return {name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def _columns(conn: psycopg.Connection[tuple[object, ...]], table: TableName) -> dict[str, str]:
    """The table's columns and their types, in order (empty when there is no such table)."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute AS a"
        " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [".".join(f'"{part}"' for part in table.parts)],
    ).fetchall()
    return {str(name): str(kind) for name, kind in rows}


def _check(table: TableName, columns: dict[str, str]) -> str:
    """The payload column's type; ``SchemaError`` unless the table has Debezium's columns."""
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise SchemaError(
            f"table {table} is not a Debezium outbox table: it lacks the columns {', '.join(missing)} "
            "(id uuid, aggregatetype, aggregateid, type, payload)"
        )
    if columns["id"] != "uuid":
        raise SchemaError(f"table {table}: Debezium's id column must be a uuid, not {columns['id']}")
    payload = columns["payload"]
    if payload not in PAYLOAD_COLUMNS:
        raise SchemaError(f"table {table}: payload must be jsonb, json, text or bytea, not {payload}")
    return payload


def _application_columns(columns: Iterable[str]) -> list[str]:
    """The columns the view puts in ``headers`` beside the id, in the table's order: not the
    payload, not the relay's own, and no more than :data:`MAX_HEADER_COLUMNS`."""
    return [name for name in columns if not name.startswith("relay_") and name not in ("id", "payload")][
        :MAX_HEADER_COLUMNS
    ]


def header_columns(read: Iterable[str]) -> set[str]:
    """The columns a ``--field-header`` can send, of those the view ``read`` from the table."""
    return {name for name in read if not name.startswith("relay_") and name != "payload"}


def view(table: TableName, columns: dict[str, str]) -> sql.Composed:
    """The view over ``table`` for its payload type, its application columns in ``headers``."""
    payload = _check(table, columns)
    fields = _application_columns(columns)
    extra = sql.SQL("").join(
        sql.SQL(", {}, o.{}::text").format(sql.Literal(name), sql.Identifier(name)) for name in fields
    )
    return sql.SQL(pieces()["view"]).format(
        payload=sql.SQL(PAYLOAD_COLUMNS[payload]), fields=extra, **identifiers(table)
    )


def migrate(conn: psycopg.Connection[tuple[object, ...]], table: TableName, done: set[int]) -> list[int]:
    """Create the table if missing, apply the steps it lacks, and (re)create its view, on ``conn``
    (in the caller's transaction, behind its lock); return the versions applied."""
    ids = identifiers(table)
    if not _columns(conn, table):
        conn.execute(sql.SQL(pieces()["create_table"]).format(**ids))
    _check(table, _columns(conn, table))
    applied = []
    for step in steps():
        if step.version in done:
            continue
        conn.execute(sql.SQL(step.template).format(**ids))
        conn.execute(
            sql.SQL("INSERT INTO {version_table} (version, name) VALUES (%s, %s)").format(**ids),
            [step.version, step.name],
        )
        applied.append(step.version)
        logger.info("applied migration %04d_%s", step.version, step.name, extra={"action": "migrate"})
    try:
        with conn.transaction():
            conn.execute(view(table, _columns(conn, table)))
    except psycopg.errors.InvalidTableDefinition as exc:
        raise SchemaError(
            f"the view {TableLayout('debezium').relation(table)} no longer fits table {table} "
            f"({exc.diag.message_primary}): drop it and run migrate again"
        ) from None
    return applied
