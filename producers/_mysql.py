"""The INSERT behind ``publish`` and ``apublish`` on MySQL 8 and MariaDB (PyMySQL, asyncmy).

The drivers are optional (``outbox-relay[mysql]``): a connection is recognised
by its class's module, so nothing here imports them.
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
    # A duplicate idempotency key writes nothing. Not INSERT IGNORE: that would
    # also turn a failed check into a warning and drop the event.
    " ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key"
)


def _driver(conn: object) -> str:
    return type(conn).__module__.split(".", 1)[0]


def is_pymysql(conn: object) -> bool:
    """Whether ``conn`` is a PyMySQL connection."""
    return _driver(conn) == "pymysql"


def is_asyncmy(conn: object) -> bool:
    """Whether ``conn`` is an asyncmy connection."""
    return _driver(conn) == "asyncmy"


@cache
def _insert_for(table: str) -> str:
    # The name is validated (letters, digits, underscores): backticks need no escaping.
    return _INSERT.format(table=".".join(f"`{part}`" for part in TableName.parse(table).parts))


def _values(params: dict[str, Any]) -> dict[str, Any]:
    deliver_at: datetime | None = params["deliver_at"]
    return {
        **params,
        "payload": json.dumps(params["payload"]),
        "headers": json.dumps(params["headers"]),
        # DATETIME(6) holds UTC, without a zone.
        "deliver_at": deliver_at.astimezone(UTC).replace(tzinfo=None) if deliver_at is not None else None,
    }


def insert(conn: Any, table: str, params: dict[str, Any]) -> None:
    """Write one event in ``conn``'s current transaction (PyMySQL)."""
    with conn.cursor() as cur:
        cur.execute(_insert_for(table), _values(params))


async def ainsert(conn: Any, table: str, params: dict[str, Any]) -> None:
    """Write one event in ``conn``'s current transaction (asyncmy)."""
    async with conn.cursor() as cur:
        await cur.execute(_insert_for(table), _values(params))
