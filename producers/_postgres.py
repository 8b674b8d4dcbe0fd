"""The INSERT on PostgreSQL: the statement for a table (JSON or bytes payload, with ``ON CONFLICT`` when
the caller gave the idempotency key), its jsonb parameters, and the check that a taken key holds the
same event (the table's same_event function)."""

from __future__ import annotations

import weakref
from functools import cache
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from producers import _encoding
from producers._errors import IdempotencyKeyTaken
from relay.config import TableName

_INSERT = (
    "INSERT INTO {table} (topic, key, payload, headers, idempotency_key, deliver_at, priority)"
    " VALUES (%(topic)s, %(key)s, %(payload)s, %(headers)s, %(idempotency_key)s,"
    " coalesce(%(deliver_at)s::timestamptz, now()), %(priority)s)"
)
#: A bytes payload: its own statement, so that a JSON publish sends what it always sent.
_INSERT_BYTES = (
    "INSERT INTO {table} (topic, key, payload_bytes, content_type, headers, idempotency_key, deliver_at, priority)"
    " VALUES (%(topic)s, %(key)s, %(payload)s, %(content_type)s, %(headers)s, %(idempotency_key)s,"
    " coalesce(%(deliver_at)s::timestamptz, now()), %(priority)s)"
)
#: Added when the caller gave the idempotency key: a key the outbox holds writes nothing. A
#: key ``publish`` made itself (a random UUID) is new, and a plain INSERT is cheaper than
#: ON CONFLICT's speculative insertion (a few microseconds of every transaction).
_ON_CONFLICT = " ON CONFLICT (idempotency_key) DO NOTHING"


#: Asked only when the given idempotency key was taken: whether the table has its same_event function
#: (migration 0005) and this session may call it; a call that fails would abort the caller's transaction.
_CAN_ASK_SAME_EVENT = "SELECT coalesce(has_function_privilege(to_regprocedure(%s), 'EXECUTE'), false)"


@cache
def _same_event_for(table: str) -> tuple[str, sql.Composed]:
    """The signature of ``table``'s same_event function (for to_regprocedure), and the call."""
    name = TableName.parse(table)
    parts = (*name.parts[:-1], name.derived("same_event"))
    signature = ".".join('"' + part.replace('"', '""') + '"' for part in parts) + "(text, text)"
    return signature, sql.SQL("SELECT {}(%s, %s)").format(sql.Identifier(*parts))


def _taken(params: dict[str, Any]) -> IdempotencyKeyTaken:
    return IdempotencyKeyTaken(
        f"idempotency key {params['idempotency_key']!r} holds an event of another topic: another writer of "
        "the table took it, and nothing was written (docs/operations.md, writers that share a table)"
    )


#: Whether a connection may ask a table's same_event function, by connection and table: asked once.
_can_ask: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()


def _check_same_event(writer: Any, table: str, params: dict[str, Any]) -> None:
    """Raise :class:`IdempotencyKeyTaken` if the event under the taken key has another topic."""
    signature, call = _same_event_for(table)
    conn = writer.connection if isinstance(writer, psycopg.Cursor) else writer
    with psycopg.Cursor(conn, row_factory=tuple_row) as cur:  # whatever rows the caller's cursors make
        known = _can_ask.setdefault(conn, {})
        if table not in known:
            known[table] = bool((cur.execute(_CAN_ASK_SAME_EVENT, [signature]).fetchone() or (False,))[0])
        if known[table]:
            same = cur.execute(call, [params["idempotency_key"], params["topic"]]).fetchone()
            if same and same[0] is False:
                raise _taken(params)


async def _acheck_same_event(writer: Any, table: str, params: dict[str, Any]) -> None:
    """:func:`_check_same_event` on an async connection or cursor."""
    signature, call = _same_event_for(table)
    conn = writer.connection if isinstance(writer, psycopg.AsyncCursor) else writer
    async with psycopg.AsyncCursor(conn, row_factory=tuple_row) as cur:
        known = _can_ask.setdefault(conn, {})
        if table not in known:
            row = await (await cur.execute(_CAN_ASK_SAME_EVENT, [signature])).fetchone()
            known[table] = bool((row or (False,))[0])
        if known[table]:
            args = [params["idempotency_key"], params["topic"]]
            same = await (await cur.execute(call, args)).fetchone()
            if same and same[0] is False:
                raise _taken(params)


@cache
def _insert_for(table: str, *, as_bytes: bool = False, given_key: bool = True) -> sql.Composed:
    text = (_INSERT_BYTES if as_bytes else _INSERT) + (_ON_CONFLICT if given_key else "")
    return sql.SQL(text).format(table=sql.Identifier(*TableName.parse(table).parts))


def _statement(table: str, params: dict[str, Any], *, given_key: bool) -> sql.Composed:
    return _insert_for(table, as_bytes="content_type" in params, given_key=given_key)


def _as_is(text: str) -> str:
    return text


def _jsonb(text: str | None, value: Any) -> Jsonb:
    """``value`` for a jsonb parameter: its checked JSON ``text`` as it is (not dumped again), or,
    without one, ``value`` for the connection's own JSON dumper."""
    if text is None:
        return Jsonb(value)
    return Jsonb(text, dumps=_as_is)  # NUL characters: refused by _params


def _check_encodes(conn: Any, params: dict[str, Any]) -> None:
    """A JSON payload that ``json`` could not encode must be one the connection's own dumper can."""
    if "content_type" not in params and params["payload_json"] is None:
        _encoding.check_connection_encodes(conn, params["payload"], "payload")


def _for_postgres(params: dict[str, Any]) -> dict[str, Any]:
    headers = _jsonb(params["headers_json"], params["headers"])
    if "content_type" in params:  # bytes, sent as they are
        return {**params, "headers": headers}
    return {**params, "payload": _jsonb(params["payload_json"], params["payload"]), "headers": headers}
