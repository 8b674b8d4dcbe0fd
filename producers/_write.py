"""The one INSERT behind ``publish`` and ``apublish``: their arguments checked (:mod:`._arguments`), the
connection checked (:mod:`._connections`), then the row written on PostgreSQL (:mod:`._postgres`) or
MySQL (:mod:`._mysql`), or a logical message (:mod:`._message`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg

from producers import _message, _mysql
from producers._arguments import (
    MAX_DELIVER_AHEAD,
    TABLE_MAX_DELIVER_AHEAD,
    _check_options,
    _params,
    _with_default,
    with_connection_json,
)
from producers._connections import _refuse_what_is_no_connection, _unfit_for_insert, _warn_autocommit
from producers._errors import AutocommitWarning, IdempotencyKeyTaken
from producers._postgres import _acheck_same_event, _check_encodes, _check_same_event, _for_postgres, _statement
from relay.config import DEFAULT_TABLE

__all__ = [
    "MAX_DELIVER_AHEAD",
    "TABLE_MAX_DELIVER_AHEAD",
    "AutocommitWarning",
    "IdempotencyKeyTaken",
    "apublish",
    "publish",
]

#: What publish() and apublish() refuse from each other (a tuple: a union is built anew at each call).
_ASYNC = (psycopg.AsyncConnection, psycopg.AsyncCursor)
_SYNC = (psycopg.Connection, psycopg.Cursor)


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
    content_type: str | None = None,
    allow_autocommit: bool = False,
    json_default: Callable[[Any], Any] | None = None,
    via: str = "table",
) -> str:
    """Write one event in ``conn``'s current transaction and return its idempotency key.

    ``via="message"`` (PostgreSQL, for ``outbox-relay run --source log``) writes
    a transactional logical message instead of a row: no table, no unique
    index (an idempotency key given twice is delivered twice), no
    ``deliver_at`` or ``priority`` (see docs/log-source.md).

    ``payload`` is anything JSON-serialisable, or ``bytes`` (also
    ``bytearray``, ``memoryview``): those go downstream exactly as they are,
    with ``content_type`` (by default ``application/octet-stream``) as the
    Kafka ``content-type`` header and the RabbitMQ ``content_type``.
    ``content_type`` is for bytes only, and must be a media type
    (``type/subtype[; name=value]``, RFC 2046): ``ValueError`` otherwise. With an ``idempotency_key`` that
    the outbox already holds, nothing is written and the key is returned; if
    the event there has another topic (another writer took the key),
    :class:`IdempotencyKeyTaken` is raised instead.
    Events with the same ``key`` are delivered in the order they are written;
    ``priority`` orders due events of different keys (higher first);
    ``deliver_at`` (timezone-aware, at most ``max_deliver_ahead`` ahead, a year
    by default, never more than the table's 366 days) holds an event back until
    that time. ``priority`` is from -1000 to 1000, as the table takes it.

    A JSON payload holding what ``json`` cannot encode (``Decimal``,
    ``datetime``, ``UUID``, ...) is refused with a ``TypeError`` naming the
    value's type and place, unless ``json_default`` encodes it (as
    ``json.dumps``'s ``default``: ``json_default=str`` writes
    ``Decimal("9.90")`` as ``"9.90"``) or the psycopg connection has its own
    JSON dumper (``psycopg.types.json.set_json_dumps``).

    ``conn`` is a psycopg ``Connection``, or a PyMySQL one for an outbox on
    MySQL 8 or MariaDB (``pip install outbox-relay[mysql]``). A connection in
    autocommit mode outside a transaction gets an :class:`AutocommitWarning`:
    the event is committed on its own, even if the writes it announces roll
    back. ``allow_autocommit=True`` publishes it so on purpose, silently.
    """
    if isinstance(conn, _ASYNC) or _mysql.is_asyncmy(conn):
        # Its execute() would make a coroutine nobody awaits: nothing written, and a key returned.
        name = type(conn).__name__
        raise TypeError(f"publish() takes a connection that writes at once, not {name}: await apublish(...) with it")
    _refuse_what_is_no_connection(conn, "publish")
    _check_options(table, max_deliver_ahead)
    payload = _with_default(payload, json_default)
    params = _params(
        topic, payload, content_type, key, headers, idempotency_key, deliver_at, priority, max_deliver_ahead
    )
    _warn_autocommit(conn, "publish", allow_autocommit)  # after the arguments' checks, as close to the SQL
    if _message.check_via(via, deliver_at=deliver_at, priority=priority, mysql=_mysql.is_pymysql(conn)):
        writer = psycopg.Cursor(conn) if _unfit_for_insert(conn) else conn
        writer.execute(_message.EMIT, [_message.envelope(with_connection_json(writer, params))])
    elif _mysql.is_pymysql(conn):
        _mysql.insert(conn, table, params)
    else:
        writer = psycopg.Cursor(conn) if _unfit_for_insert(conn) else conn
        _check_encodes(writer, params)
        given_key = idempotency_key not in (None, "")
        written = writer.execute(_statement(table, params, given_key=given_key), _for_postgres(params))
        if given_key and written.rowcount == 0:  # taken: the same event again, or another writer's
            _check_same_event(writer, table, params)
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
    content_type: str | None = None,
    allow_autocommit: bool = False,
    json_default: Callable[[Any], Any] | None = None,
    via: str = "table",
) -> str:
    """The same as :func:`publish`, for a psycopg ``AsyncConnection`` or an asyncmy connection."""
    if isinstance(conn, _SYNC) or _mysql.is_pymysql(conn):
        raise TypeError(f"apublish() takes an async connection, not {type(conn).__name__}: call publish(...) with it")
    _refuse_what_is_no_connection(conn, "apublish")
    _check_options(table, max_deliver_ahead)
    payload = _with_default(payload, json_default)
    params = _params(
        topic, payload, content_type, key, headers, idempotency_key, deliver_at, priority, max_deliver_ahead
    )
    _warn_autocommit(conn, "apublish", allow_autocommit)
    if _message.check_via(via, deliver_at=deliver_at, priority=priority, mysql=_mysql.is_asyncmy(conn)):
        writer = psycopg.AsyncCursor(conn) if _unfit_for_insert(conn) else conn
        await writer.execute(_message.EMIT, [_message.envelope(with_connection_json(writer, params))])
    elif _mysql.is_asyncmy(conn):
        await _mysql.ainsert(conn, table, params)
    else:
        awriter = psycopg.AsyncCursor(conn) if _unfit_for_insert(conn) else conn
        _check_encodes(awriter, params)
        given_key = idempotency_key not in (None, "")
        written = await awriter.execute(_statement(table, params, given_key=given_key), _for_postgres(params))
        if given_key and written.rowcount == 0:  # taken: the same event again, or another writer's
            await _acheck_same_event(awriter, table, params)
    return str(params["idempotency_key"])
