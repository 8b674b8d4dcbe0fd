"""The one INSERT behind ``publish`` and ``apublish``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from producers import _mysql
from producers._tracing import with_trace_context
from relay.config import DEFAULT_TABLE, TableName

_INSERT = (
    "INSERT INTO {table} (topic, key, payload, headers, idempotency_key, deliver_at, priority)"
    " VALUES (%(topic)s, %(key)s, %(payload)s, %(headers)s, %(idempotency_key)s,"
    " coalesce(%(deliver_at)s::timestamptz, now()), %(priority)s)"
    " ON CONFLICT (idempotency_key) DO NOTHING"
)


#: How far ahead ``deliver_at`` may lie. Further is almost always a mistake (a
#: unit mix-up, a sentinel like ``datetime(9999, ...)``), and such an event would
#: hold back every later event of its key until then; pass ``max_deliver_ahead``
#: to allow more.
MAX_DELIVER_AHEAD = timedelta(days=365)


@cache
def _insert_for(table: str) -> sql.Composed:
    return sql.SQL(_INSERT).format(table=sql.Identifier(*TableName.parse(table).parts))


def _params(
    topic: str,
    payload: Any,
    key: str | None,
    headers: Mapping[str, str] | None,
    idempotency_key: str | None,
    deliver_at: datetime | None,
    priority: int,
    max_deliver_ahead: timedelta,
) -> dict[str, Any]:
    if not isinstance(topic, str) or not topic:
        raise ValueError("topic must be a non-empty string")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string or None, not {type(key).__name__}")
    if headers is not None and not all(isinstance(k, str) and k and isinstance(v, str) for k, v in headers.items()):
        raise TypeError("headers must map non-empty strings to strings")
    if deliver_at is not None:
        _check_deliver_at(deliver_at, max_deliver_ahead)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError("priority must be an int")
    return {
        "topic": topic,
        "key": key,
        "payload": payload,
        "headers": with_trace_context(headers),
        "idempotency_key": idempotency_key or str(uuid.uuid4()),
        "deliver_at": deliver_at,
        "priority": priority,
    }


def _check_deliver_at(deliver_at: object, max_ahead: timedelta) -> None:
    if not isinstance(deliver_at, datetime):
        raise TypeError(f"deliver_at must be a datetime or None, not {type(deliver_at).__name__}")
    if deliver_at.utcoffset() is None:
        raise ValueError("deliver_at must be timezone-aware (e.g. datetime.now(UTC) + timedelta(hours=1))")
    if deliver_at - datetime.now(UTC) > max_ahead:
        raise ValueError(
            f"deliver_at {deliver_at.isoformat()} is more than {max_ahead} ahead; an event that far out would hold "
            "back its key's later events until then (pass max_deliver_ahead= to allow it)"
        )


def _for_postgres(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "payload": Jsonb(params["payload"]), "headers": Jsonb(params["headers"])}


def publish(
    conn: psycopg.Connection[Any] | Any,
    topic: str,
    payload: Any,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    deliver_at: datetime | None = None,
    priority: int = 0,
    table: str = DEFAULT_TABLE,
    max_deliver_ahead: timedelta = MAX_DELIVER_AHEAD,
) -> str:
    """Write one event in ``conn``'s current transaction and return its idempotency key.

    ``payload`` is anything JSON-serialisable. With an ``idempotency_key`` that
    the outbox already holds, nothing is written and the key is returned.
    Events with the same ``key`` are delivered in the order they are written;
    ``priority`` orders due events of different keys (higher first);
    ``deliver_at`` (timezone-aware, at most ``max_deliver_ahead`` ahead, a year
    by default) holds an event back until that time.

    ``conn`` is a psycopg ``Connection``, or a PyMySQL one for an outbox on
    MySQL 8 or MariaDB (``pip install outbox-relay[mysql]``).
    """
    params = _params(topic, payload, key, headers, idempotency_key, deliver_at, priority, max_deliver_ahead)
    if _mysql.is_pymysql(conn):
        _mysql.insert(conn, table, params)
    else:
        conn.execute(_insert_for(table), _for_postgres(params))
    return str(params["idempotency_key"])


async def apublish(
    conn: psycopg.AsyncConnection[Any] | Any,
    topic: str,
    payload: Any,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    deliver_at: datetime | None = None,
    priority: int = 0,
    table: str = DEFAULT_TABLE,
    max_deliver_ahead: timedelta = MAX_DELIVER_AHEAD,
) -> str:
    """The same as :func:`publish`, for a psycopg ``AsyncConnection`` or an asyncmy connection."""
    params = _params(topic, payload, key, headers, idempotency_key, deliver_at, priority, max_deliver_ahead)
    if _mysql.is_asyncmy(conn):
        await _mysql.ainsert(conn, table, params)
    else:
        await conn.execute(_insert_for(table), _for_postgres(params))
    return str(params["idempotency_key"])
