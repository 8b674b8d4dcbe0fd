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

import inspect
import json
import weakref
from datetime import UTC, datetime
from functools import cache
from typing import Any

from producers._encoding import unencodable_error
from producers._errors import IdempotencyKeyTaken
from relay.config import TableName

# Text and bytes other than the headers' JSON travel as hexadecimal digits, UNHEX()ed by the server: ASCII that
# no charset or sql_mode reads otherwise. Sent as they are, a topic was cut at its first character
# past the BMP on a utf8mb3 connection without strict mode, and asyncmy escapes bytes with
# backslashes even under NO_BACKSLASH_ESCAPES (each backslash doubled, a quote closing the literal).
# A JSON payload goes the same way, as UTF-8: the relay sends its text as it is stored, and JSON
# with non-ASCII escaped as \uXXXX made a body up to three times what PostgreSQL sends (past a
# broker's message size where PostgreSQL's was delivered) and other bytes than its consumers saw.
_INSERT = (
    "INSERT INTO {table} (topic, `key`, payload, headers, idempotency_key, deliver_at, priority)"
    " VALUES (CONVERT(UNHEX(%(topic)s) USING utf8mb4), UNHEX(%(key)s), CONVERT(UNHEX(%(payload)s) USING utf8mb4),"
    " %(headers)s,"
    " UNHEX(%(idempotency_key)s), COALESCE(%(deliver_at)s, UTC_TIMESTAMP(6)), %(priority)s)"
)
#: A bytes payload: its own statement, with its content type.
_INSERT_BYTES = (
    "INSERT INTO {table} (topic, `key`, payload_bytes, content_type, headers, idempotency_key, deliver_at, priority)"
    " VALUES (CONVERT(UNHEX(%(topic)s) USING utf8mb4), UNHEX(%(key)s), UNHEX(%(payload)s),"
    " CONVERT(UNHEX(%(content_type)s) USING utf8mb4), %(headers)s, UNHEX(%(idempotency_key)s),"
    " COALESCE(%(deliver_at)s, UTC_TIMESTAMP(6)), %(priority)s)"
)
#: "Duplicate entry … for key …" (both servers, both drivers: the error's first argument).
_DUPLICATE_KEY = 1062
#: A statement longer than the server's max_allowed_packet makes it close the
#: connection (errors 1153, 2006, 2013): the caller's transaction is lost with
#: it. One whose payload and headers, escaped at worst (each byte doubled),
#: stay under this needs no check; a longer one is checked against the
#: server's limit before it is sent.
_UNCHECKED_BYTES = 1 << 20
#: The statement's text, columns and escaping besides payload and headers, with room to spare.
_STATEMENT_MARGIN = 8 * 1024
#: The server's max_allowed_packet, by connection (asked once, for the first large event).
_max_packet: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _driver(conn: object) -> str:
    return type(conn).__module__.split(".", 1)[0]


def is_pymysql(conn: object) -> bool:
    """Whether ``conn`` is a PyMySQL connection."""
    return _driver(conn) == "pymysql"


def is_asyncmy(conn: object) -> bool:
    """Whether ``conn`` is an asyncmy connection."""
    return _driver(conn) == "asyncmy"


def is_either(conn: object) -> bool:
    """Whether ``conn`` comes from PyMySQL or asyncmy (one look at its type, for every publish)."""
    return _driver(conn) in ("pymysql", "asyncmy")


def is_connection(conn: object) -> bool:
    """Whether ``conn`` (of either driver) is a connection, not a cursor or a pool."""
    return callable(getattr(conn, "cursor", None)) and callable(getattr(conn, "commit", None))


#: MySQL's server status flags (the OK packet's): a transaction is open; autocommit is on.
_IN_TRANSACTION = 0x0001
_AUTOCOMMIT = 0x0002


def commits_each_statement(conn: Any) -> bool:
    """Whether ``conn`` (either driver) is in autocommit mode with no transaction open: an INSERT on it
    would commit at once. Read from the server status the last reply carried (``begin()`` opens one)."""
    status = getattr(conn, "server_status", None)
    return isinstance(status, int) and bool(status & _AUTOCOMMIT) and not status & _IN_TRANSACTION


@cache
def _insert_for(table: str, *, as_bytes: bool = False) -> str:
    # The name is validated (letters, digits, underscores): backticks need no escaping.
    quoted = ".".join(f"`{part}`" for part in TableName.parse(table).parts)
    return (_INSERT_BYTES if as_bytes else _INSERT).format(table=quoted)


@cache
def _same_event_for(table: str) -> str:
    """The call of ``table``'s same_event function (migration 0006) with an event's hexed values."""
    name = TableName.parse(table)
    quoted = ".".join(f"`{part}`" for part in (*name.parts[:-1], name.derived("same_event")))
    return f"SELECT {quoted}(UNHEX(%(idempotency_key)s), UNHEX(%(topic)s))"


#: The function is missing (a table older than migration 0006) or the session may not call it:
#: the statement fails alone, and publish() goes on as before it.
_CANNOT_ASK = (1305, 1370, 1449)


def _taken_error(params: dict[str, Any]) -> Exception:
    return IdempotencyKeyTaken(
        f"idempotency key {params['idempotency_key']!r} holds an event of another topic: another writer of "
        "the table took it, and nothing was written (docs/operations.md, writers that share a table)"
    )


def _statement(table: str, params: dict[str, Any]) -> str:
    # Bytes parameters (producers._arguments._payload_params) carry a content type; JSON ones never do.
    return _insert_for(table, as_bytes="content_type" in params)


def _values(params: dict[str, Any]) -> dict[str, Any]:
    deliver_at: datetime | None = params["deliver_at"]
    as_bytes = "content_type" in params
    return {
        **params,
        # Both drivers send bytes as a _binary literal: stored exactly, whatever the connection's charset.
        # A value json cannot write (None from _json_text) fails here, before any SQL, naming its type.
        # JSON text as UTF-8, not escaped (see _INSERT); it was checked as payload_json (NaN, surrogates).
        "payload": params["payload"] if as_bytes else _utf8_json(params["payload"]),
        "headers": params["headers_json"],
        # VARBINARY columns keep the bytes they are sent: as text, a key or idempotency key would be
        # stored in the connection's charset (latin1's 'café' is not utf8mb4's), one event written
        # twice and one key split in two. As UTF-8 they are the same whatever the connection speaks.
        "key": None if params["key"] is None else params["key"].encode("utf-8"),
        "idempotency_key": params["idempotency_key"].encode("utf-8"),
        "topic": params["topic"].encode("utf-8"),
        **({"content_type": params["content_type"].encode("utf-8")} if as_bytes else {}),
        # DATETIME(6) holds UTC, without a zone.
        "deliver_at": deliver_at.astimezone(UTC).replace(tzinfo=None) if deliver_at is not None else None,
    }


def _utf8_json(payload: Any) -> bytes:
    """``payload`` as JSON text in UTF-8, non-ASCII characters as themselves, as PostgreSQL's jsonb gives them."""
    try:
        return json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except TypeError:  # MySQL's drivers have no JSON dumper of their own: json_default is the hook
        raise unencodable_error(payload, "payload") from None


def _hexed(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as the statements take them: every bytes value as its hexadecimal digits (see _INSERT)."""
    return {
        name: value.hex() if isinstance(value, bytes | bytearray | memoryview) else value
        for name, value in values.items()
    }


def _first(row: Any) -> Any:
    """The first column of a row from any cursor class (a tuple, or a dict from a DictCursor)."""
    return next(iter(row.values())) if isinstance(row, dict) else row[0]


def _duplicate_idempotency_key(exc: Exception) -> bool:
    # The table's only unique keys are its id (never written here) and the
    # idempotency key, whose index name ends in idempotency_key_key.
    return exc.args[:1] == (_DUPLICATE_KEY,) and "idempotency_key" in str(exc.args[1:2])


def _raw_bytes(values: dict[str, Any]) -> int:
    payload = values["payload"]
    size = len(payload) if isinstance(payload, bytes) else len(payload.encode("utf-8", "surrogatepass"))
    return size + len((values["headers"] or "").encode("utf-8", "surrogatepass"))


def _check_packet(statement_bytes: int, limit: int) -> None:
    if statement_bytes > limit:
        raise ValueError(
            f"the event makes a statement of {statement_bytes:,} bytes, more than the server's max_allowed_packet "
            f"({limit:,} bytes), which would close the connection and lose the transaction: make the payload "
            "smaller, or raise max_allowed_packet on the server"
        )


def _statement_bytes(cur: Any, statement: str, values: dict[str, Any]) -> int:
    text = cur.mogrify(statement, values)
    return len(text.encode("utf-8", "surrogateescape")) if isinstance(text, str) else len(text)


def insert(conn: Any, table: str, params: dict[str, Any]) -> None:
    """Write one event in ``conn``'s current transaction (PyMySQL)."""
    values = _values(params)
    statement = _statement(table, params)
    raw = _raw_bytes(values)
    values = _hexed(values)
    with conn.cursor() as cur:
        if 2 * raw + _STATEMENT_MARGIN > _UNCHECKED_BYTES:
            if conn not in _max_packet:
                cur.execute("SELECT @@max_allowed_packet")
                _max_packet[conn] = int(_first(cur.fetchone()))
            limit = _max_packet[conn]
            if 2 * raw + _STATEMENT_MARGIN > limit:
                _check_packet(max(raw, _statement_bytes(cur, statement, values)), limit)
        try:
            cur.execute(statement, values)
        except Exception as exc:
            if not _duplicate_idempotency_key(exc):
                raise
            try:
                cur.execute(_same_event_for(table), values)
            except Exception as asked:
                if asked.args[:1] not in {(code,) for code in _CANNOT_ASK}:
                    raise
                return
            if _first(cur.fetchone()) == 0:
                raise _taken_error(params) from None


async def ainsert(conn: Any, table: str, params: dict[str, Any]) -> None:
    """Write one event in ``conn``'s current transaction (asyncmy)."""
    values = _values(params)
    statement = _statement(table, params)
    raw = _raw_bytes(values)
    values = _hexed(values)
    async with conn.cursor() as cur:
        if 2 * raw + _STATEMENT_MARGIN > _UNCHECKED_BYTES:
            if conn not in _max_packet:
                await cur.execute("SELECT @@max_allowed_packet")
                _max_packet[conn] = int(_first(await cur.fetchone()))
            limit = _max_packet[conn]
            if 2 * raw + _STATEMENT_MARGIN > limit:
                text = cur.mogrify(statement, values)
                text = await text if inspect.isawaitable(text) else text
                size = len(text.encode("utf-8", "surrogateescape")) if isinstance(text, str) else len(text)
                _check_packet(max(raw, size), limit)
        try:
            await cur.execute(statement, values)
        except Exception as exc:
            if not _duplicate_idempotency_key(exc):
                raise
            try:
                await cur.execute(_same_event_for(table), values)
            except Exception as asked:
                if asked.args[:1] not in {(code,) for code in _CANNOT_ASK}:
                    raise
                return
            if _first(await cur.fetchone()) == 0:
                raise _taken_error(params) from None
