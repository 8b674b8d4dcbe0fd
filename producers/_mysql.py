"""The INSERT behind ``publish`` and ``apublish`` on MySQL 8 and MariaDB (PyMySQL, asyncmy).

The drivers are optional (``outbox-relay[mysql]``): a connection is recognised
by its class's module, so nothing here imports them.

A duplicate idempotency key writes nothing: the plain INSERT fails with a
duplicate-key error (1062), which InnoDB undoes alone (the caller's
transaction goes on), and which is taken here as "already written". Not
``ON DUPLICATE KEY UPDATE``: MariaDB then wants UPDATE on every inserted
column, which the writer role (``migrate --create-roles``) rightly lacks. Not
``INSERT IGNORE``: that would also turn a failed check into a warning and drop
the event.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cache
from typing import Any

from relay.config import TableName

_INSERT = (
    "INSERT INTO {table} (topic, `key`, payload, headers, idempotency_key, deliver_at, priority)"
    " VALUES (%(topic)s, %(key)s, %(payload)s, %(headers)s, %(idempotency_key)s,"
    " COALESCE(%(deliver_at)s, UTC_TIMESTAMP(6)), %(priority)s)"
)
#: A bytes payload: its own statement, so that a JSON publish sends what it always sent.
_INSERT_BYTES = (
    "INSERT INTO {table} (topic, `key`, payload_bytes, content_type, headers, idempotency_key, deliver_at, priority)"
    " VALUES (%(topic)s, %(key)s, %(payload)s, %(content_type)s, %(headers)s, %(idempotency_key)s,"
    " COALESCE(%(deliver_at)s, UTC_TIMESTAMP(6)), %(priority)s)"
)
#: "Duplicate entry … for key …" (both servers, both drivers: the error's first argument).
_DUPLICATE_KEY = 1062


def _driver(conn: object) -> str:
    return type(conn).__module__.split(".", 1)[0]


def is_pymysql(conn: object) -> bool:
    """Whether ``conn`` is a PyMySQL connection."""
    return _driver(conn) == "pymysql"


def is_asyncmy(conn: object) -> bool:
    """Whether ``conn`` is an asyncmy connection."""
    return _driver(conn) == "asyncmy"


@cache
def _insert_for(table: str, *, as_bytes: bool = False) -> str:
    # The name is validated (letters, digits, underscores): backticks need no escaping.
    quoted = ".".join(f"`{part}`" for part in TableName.parse(table).parts)
    return (_INSERT_BYTES if as_bytes else _INSERT).format(table=quoted)


def _statement(table: str, params: dict[str, Any]) -> str:
    # Bytes parameters (producers._write._payload_params) carry a content type; JSON ones never do.
    return _insert_for(table, as_bytes="content_type" in params)


def _values(params: dict[str, Any]) -> dict[str, Any]:
    deliver_at: datetime | None = params["deliver_at"]
    as_bytes = "content_type" in params
    return {
        **params,
        # Both drivers send bytes as a _binary literal: stored exactly, whatever the connection's charset.
        # A value json cannot write (None from _json_text) fails here, before any SQL, as it always did.
        "payload": params["payload"] if as_bytes else params["payload_json"] or json.dumps(params["payload"]),
        "headers": params["headers_json"],
        # DATETIME(6) holds UTC, without a zone.
        "deliver_at": deliver_at.astimezone(UTC).replace(tzinfo=None) if deliver_at is not None else None,
    }


def _duplicate_idempotency_key(exc: Exception) -> bool:
    # The table's only unique keys are its id (never written here) and the
    # idempotency key, whose index name ends in idempotency_key_key.
    return exc.args[:1] == (_DUPLICATE_KEY,) and "idempotency_key" in str(exc.args[1:2])


def insert(conn: Any, table: str, params: dict[str, Any]) -> None:
    """Write one event in ``conn``'s current transaction (PyMySQL)."""
    with conn.cursor() as cur:
        try:
            cur.execute(_statement(table, params), _values(params))
        except Exception as exc:
            if not _duplicate_idempotency_key(exc):
                raise


async def ainsert(conn: Any, table: str, params: dict[str, Any]) -> None:
    """Write one event in ``conn``'s current transaction (asyncmy)."""
    async with conn.cursor() as cur:
        try:
            await cur.execute(_statement(table, params), _values(params))
        except Exception as exc:
            if not _duplicate_idempotency_key(exc):
                raise
