"""The one INSERT behind ``publish`` and ``apublish``."""

from __future__ import annotations

import json
import re
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from producers import _encoding, _message, _mysql
from producers._tracing import with_trace_context
from relay.attribute_values import media_type_problem, shown
from relay.config import DEFAULT_TABLE, TableName

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

#: The content type of a bytes payload published without one (RFC 2046: arbitrary bytes).
DEFAULT_BYTES_CONTENT_TYPE = "application/octet-stream"
#: RabbitMQ carries the content type as an AMQP short string.
CONTENT_TYPE_MAX_BYTES = 255


#: How far ahead ``deliver_at`` may lie. Further is almost always a mistake (a
#: unit mix-up, a sentinel like ``datetime(9999, ...)``), and such an event would
#: hold back every later event of its key until then; pass ``max_deliver_ahead``
#: to allow less.
MAX_DELIVER_AHEAD = timedelta(days=365)
#: What the table itself takes (its writer_bounds trigger, migration 0005): a
#: day more than publish()'s year, for the clocks of two hosts. No
#: ``max_deliver_ahead`` reaches past it.
TABLE_MAX_DELIVER_AHEAD = timedelta(days=366)


class IdempotencyKeyTaken(ValueError):
    """The idempotency key holds an event of another topic: another writer of the table took it.

    Nothing was written, and the caller's transaction goes on.
    """


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


def _payload_params(payload: Any, content_type: str | None) -> dict[str, Any]:
    """The payload's parameters: JSON, or bytes with their content type."""
    if isinstance(payload, bytes | bytearray | memoryview):
        content_type = DEFAULT_BYTES_CONTENT_TYPE if content_type is None else content_type
        if not isinstance(content_type, str) or not content_type:
            raise ValueError("content_type must be a non-empty string")
        if "\x00" in content_type:  # psycopg refuses it while sending; MySQL's column would keep it
            raise ValueError("content_type holds a NUL character (\\x00), which PostgreSQL cannot store")
        _check_no_lone_surrogate(content_type, "content_type")
        if len(content_type.encode()) > CONTENT_TYPE_MAX_BYTES:
            raise ValueError(f"content_type must be at most {CONTENT_TYPE_MAX_BYTES} bytes of UTF-8")
        # The relay sends it as a header (Kafka content-type, AMQP content_type, CloudEvents datacontenttype).
        if problem := media_type_problem(content_type):
            raise ValueError(f"content_type {shown(content_type)} {problem}, e.g. application/x-protobuf")
        return {"payload": bytes(payload), "content_type": content_type}
    if content_type is not None:
        raise TypeError(
            "content_type goes with a bytes payload only; a JSON payload is application/json (encode it to bytes "
            "to send it with another content type)"
        )
    return {"payload": payload}


def _params(
    topic: str,
    payload: Any,
    content_type: str | None,
    key: str | None,
    headers: Mapping[str, str] | None,
    idempotency_key: str | None,
    deliver_at: datetime | None,
    priority: int,
    max_deliver_ahead: timedelta,
) -> dict[str, Any]:
    if not isinstance(topic, str) or not topic:
        raise ValueError("topic must be a non-empty string")
    if len(topic) > TOPIC_MAX_CHARS:
        raise ValueError(f"topic must be at most {TOPIC_MAX_CHARS} characters")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string or None, not {type(key).__name__}")
    if key is not None and len(key) * 4 > KEY_MAX_BYTES and len(key.encode("utf-8", "surrogatepass")) > KEY_MAX_BYTES:
        raise ValueError(f"key must be at most {KEY_MAX_BYTES} bytes of UTF-8")
    if headers is not None and not (
        isinstance(headers, Mapping)
        and all(isinstance(k, str) and k and isinstance(v, str) for k, v in headers.items())
    ):
        raise TypeError("headers must map non-empty strings to strings")
    if isinstance(idempotency_key, uuid.UUID | int) and not isinstance(idempotency_key, bool):
        idempotency_key = str(idempotency_key)  # as the table's text column took them before this check
    elif idempotency_key is not None and not isinstance(idempotency_key, str):
        raise TypeError(f"idempotency_key must be a string or None, not {type(idempotency_key).__name__}")
    if idempotency_key is not None and len(idempotency_key) > IDEMPOTENCY_KEY_MAX_CHARS:
        raise ValueError(f"idempotency_key must be at most {IDEMPOTENCY_KEY_MAX_CHARS} characters")
    _check_no_nul(topic, key, idempotency_key, headers)
    if deliver_at is not None:
        _check_deliver_at(deliver_at, max_deliver_ahead)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError("priority must be an int")
    if priority not in PRIORITY_RANGE:
        raise ValueError(f"priority must be from {PRIORITY_RANGE.start} to {PRIORITY_RANGE.stop - 1}")
    written = _payload_params(payload, content_type)
    if "content_type" not in written:
        written["payload_json"] = _json_text(payload, "payload")
        _check_depth(payload, written["payload_json"])
        if written["payload_json"] is not None:
            _check_jsonb(written["payload_json"], "payload")  # MySQL would keep it: refused on both
    headers = with_trace_context(headers)
    return {
        "topic": topic,
        "key": key,
        **written,
        "headers": headers,
        "headers_json": _json_text(headers, "headers"),
        "idempotency_key": idempotency_key or str(uuid.uuid4()),
        "deliver_at": deliver_at,
        "priority": priority,
    }


#: The table's limits (its CHECK constraints and writer_bounds trigger, on both databases).
TOPIC_MAX_CHARS = 249
#: MySQL's ``key`` column (VARBINARY(1024)); on PostgreSQL the key's index would
#: refuse about 2,700 bytes, aborting the caller's transaction. The same limit on both.
KEY_MAX_BYTES = 1024
IDEMPOTENCY_KEY_MAX_CHARS = 200
#: Priorities the table takes: a writer sharing it cannot go before every other writer's
#: events with 2**31-1 (docs/operations.md, "Writers that share a table").
PRIORITY_RANGE = range(-1000, 1001)
#: MariaDB's JSON holds at most 31 arrays or objects one in another (MySQL 8's 100, PostgreSQL's
#: more than Python's recursion limit): the same limit on every database.
JSON_MAX_DEPTH = 31
_ARRAYS_OR_OBJECTS = (dict, list, tuple)
_TOO_DEEP = f"payload is nested more than {JSON_MAX_DEPTH} arrays or objects deep, which MariaDB's JSON cannot store"


#: A NUL character in JSON text: \u0000 after an even number of backslashes (an odd number spells a backslash).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _json_text(value: Any, what: str) -> str | None:
    """``value`` as the JSON text the database gets; None for a value of a type only the
    connection's own JSON dumper knows (psycopg's ``set_json_dumps``: ``Decimal``, ...).

    Both databases refuse NaN and Infinity (no JSON) and a lone surrogate (no
    text): refused there, they would abort the caller's transaction on
    PostgreSQL, so they are refused here, before any SQL.
    """
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError as exc:  # NaN or Infinity ("Out of range float values ..."), or a circular reference
        raise ValueError(f"{what} cannot be written as JSON: {exc}") from None
    except TypeError:
        return None
    except RecursionError:  # thousands of levels; _check_depth's limit is far lower
        raise ValueError(_TOO_DEEP) from None
    if "\\ud" in text:  # characters past the BMP, as surrogate pairs; rarely a lone surrogate
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
    return text


def _check_depth(payload: Any, text: str | None) -> None:
    """Refuse a payload nested deeper than ``JSON_MAX_DEPTH``: MariaDB's JSON check would fail the
    statement, where PostgreSQL writes it."""
    if text is not None and text.count("[") + text.count("{") <= JSON_MAX_DEPTH:
        return  # fewer brackets than levels allowed, strings included: no walk needed
    # What json.dumps writes as arrays and objects, a level at a time (a loop, possible with a
    # connection's own dumper, ends here too).
    level = [payload] if isinstance(payload, _ARRAYS_OR_OBJECTS) else []
    for _ in range(JSON_MAX_DEPTH):
        level = [
            child
            for value in level
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, _ARRAYS_OR_OBJECTS)
        ]
    if level:
        raise ValueError(_TOO_DEEP)


def _check_jsonb(text: str, what: str) -> None:
    """Refuse what PostgreSQL's ``jsonb`` refuses and MySQL's JSON keeps: a NUL character."""
    if "\\u0000" in text and _NUL.search(text):
        raise ValueError(f"{what} holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store")


def _check_no_nul(topic: str, key: str | None, idempotency_key: str | None, headers: Mapping[str, str] | None) -> None:
    """Refuse a NUL character in the text columns: PostgreSQL's text cannot hold one, MySQL's would.
    And a lone surrogate, which no database takes: the codec's error named no argument."""
    texts = [("topic", topic), ("key", key), ("idempotency_key", idempotency_key)]
    for what, text in texts:
        if text is not None and "\x00" in text:
            raise ValueError(f"{what} holds a NUL character (\\x00), which PostgreSQL cannot store")
        if text is not None and not text.isascii():
            _check_no_lone_surrogate(text, what)
    for name, value in (headers or {}).items():
        if "\x00" in name or "\x00" in value:
            raise ValueError("a header holds a NUL character (\\x00), which PostgreSQL cannot store")


def _check_no_lone_surrogate(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate (\\ud800-\\udfff), which is not text") from None


def _check_options(table: object, max_deliver_ahead: object) -> None:
    """Refuse a ``table`` or ``max_deliver_ahead`` of the wrong type, with or without a ``deliver_at``."""
    if not isinstance(table, str):
        raise TypeError(f"table must be a string, not {type(table).__name__}")
    if not isinstance(max_deliver_ahead, timedelta):
        raise TypeError(f"max_deliver_ahead must be a timedelta, not {type(max_deliver_ahead).__name__}")


def _check_deliver_at(deliver_at: object, max_ahead: timedelta) -> None:
    if not isinstance(deliver_at, datetime):
        raise TypeError(f"deliver_at must be a datetime or None, not {type(deliver_at).__name__}")
    if deliver_at.utcoffset() is None:
        raise ValueError("deliver_at must be timezone-aware (e.g. datetime.now(UTC) + timedelta(hours=1))")
    try:
        deliver_at.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01 03:00+05:00, before year 1 in UTC
        raise ValueError(f"deliver_at {deliver_at.isoformat()} is out of range in UTC") from None
    ahead = deliver_at - datetime.now(UTC)
    if ahead > TABLE_MAX_DELIVER_AHEAD:
        raise ValueError(
            f"deliver_at {deliver_at.isoformat()} is more than {TABLE_MAX_DELIVER_AHEAD.days} days ahead, which the "
            "outbox table refuses: an event that far out would hold back its key's later events until then"
        )
    if ahead > max_ahead:
        raise ValueError(
            f"deliver_at {deliver_at.isoformat()} is more than {max_ahead} ahead; an event that far out would hold "
            f"back its key's later events until then (max_deliver_ahead= allows up to {TABLE_MAX_DELIVER_AHEAD.days} "
            "days)"
        )


def _as_is(text: str) -> str:
    return text


def _jsonb(text: str | None, value: Any) -> Jsonb:
    """``value`` for a jsonb parameter: its checked JSON ``text`` as it is (not dumped again), or,
    without one, ``value`` for the connection's own JSON dumper."""
    if text is None:
        return Jsonb(value)
    return Jsonb(text, dumps=_as_is)  # NUL characters: refused by _params


def _with_default(payload: Any, json_default: Callable[[Any], Any] | None) -> Any:
    """``payload`` with what JSON cannot encode replaced through ``json_default``, if given."""
    if json_default is None or isinstance(payload, bytes | bytearray | memoryview):
        return payload
    return _encoding.encoded(payload, json_default, "payload")


def _check_encodes(conn: Any, params: dict[str, Any]) -> None:
    """A JSON payload that ``json`` could not encode must be one the connection's own dumper can."""
    if "content_type" not in params and params["payload_json"] is None:
        _encoding.check_connection_encodes(conn, params["payload"], "payload")


def _for_postgres(params: dict[str, Any]) -> dict[str, Any]:
    headers = _jsonb(params["headers_json"], params["headers"])
    if "content_type" in params:  # bytes, sent as they are
        return {**params, "headers": headers}
    return {**params, "payload": _jsonb(params["payload_json"], params["payload"]), "headers": headers}


def _check_encoding(conn: Any) -> None:
    """``ValueError``, before any SQL, unless the database is UTF8: on SQL_ASCII each writer's
    client encoding decides the bytes stored (one key, two spellings), and on LATIN1 and the like
    jsonb refuses the escapes of non-ASCII text, failing the caller's transaction."""
    info = getattr(conn, "info", None) or getattr(getattr(conn, "connection", None), "info", None)
    encoding = info.parameter_status("server_encoding") if isinstance(info, psycopg.ConnectionInfo) else None
    if encoding is not None and encoding != "UTF8":
        raise ValueError(f"the database is encoded in {encoding}: the outbox needs a UTF8 database")


#: Cursors the INSERT cannot run on: a server-side cursor would DECLARE it (a syntax error that fails
#: the caller's transaction), a raw one takes no named parameters.
_UNFIT_CURSORS = (psycopg.ServerCursor, psycopg.AsyncServerCursor, psycopg.RawCursor, psycopg.AsyncRawCursor)


def _unfit_for_insert(conn: Any) -> bool:
    """Check ``conn`` before any SQL; True if it is a connection whose cursors are raw ones, so that
    the INSERT must run on a cursor of its own."""
    if isinstance(conn, _UNFIT_CURSORS):
        raise TypeError(f"publish() takes a connection or a client-side cursor, not a {type(conn).__name__}")
    _check_encoding(conn)
    factory = getattr(conn, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, psycopg.RawCursor | psycopg.AsyncRawCursor)


def _refuse_what_is_no_connection(conn: Any, function: str) -> None:
    """``TypeError``, before any SQL, for what the INSERT cannot run on (a pool, a MySQL cursor, None),
    the same on every driver; they failed with an ``AttributeError`` from deep inside."""
    if _mysql.is_pymysql(conn) or _mysql.is_asyncmy(conn):
        usable = _mysql.is_connection(conn)
    else:
        usable = callable(getattr(conn, "execute", None))  # a psycopg connection or cursor, or one alike
    if not usable:
        name = type(conn).__name__
        hint = ": take a connection from the pool" if "pool" in name.lower() else ""
        raise TypeError(f"{function}() takes a connection, not {name}{hint}")


class AutocommitWarning(UserWarning):
    """An event published on a connection in autocommit mode outside a transaction: it commits on its own."""


def _warn_autocommit(conn: Any, function: str, allow_autocommit: bool) -> None:
    """Warn (:class:`AutocommitWarning`), before any SQL, for a connection in autocommit mode outside a
    transaction: the INSERT commits at once, on its own, whatever becomes of the caller's business writes.

    A warning and not an error: code that publishes so on purpose (a script, a backfill, tests of
    earlier releases) keeps working; ``allow_autocommit=True`` says it is on purpose and silences it.
    """
    if allow_autocommit:
        return
    if _mysql.is_pymysql(conn) or _mysql.is_asyncmy(conn):
        alone = _mysql.commits_each_statement(conn)
    else:
        owner = getattr(conn, "connection", conn)  # a cursor writes on its connection
        info = getattr(owner, "info", None)
        alone = (
            getattr(owner, "autocommit", False) is True
            and isinstance(info, psycopg.ConnectionInfo)
            and info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
    if alone:
        warnings.warn(
            f"{function}() on a connection in autocommit mode outside a transaction commits the event on its "
            "own, apart from the writes it goes with: open a transaction first (psycopg: with conn.transaction(); "
            "PyMySQL: conn.begin()), or pass allow_autocommit=True to publish it on its own on purpose",
            AutocommitWarning,
            stacklevel=3,
        )


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
    if isinstance(conn, psycopg.AsyncConnection | psycopg.AsyncCursor) or _mysql.is_asyncmy(conn):
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
        (psycopg.Cursor(conn) if _unfit_for_insert(conn) else conn).execute(_message.EMIT, [_message.envelope(params)])
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
    if isinstance(conn, psycopg.Connection | psycopg.Cursor) or _mysql.is_pymysql(conn):
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
        await writer.execute(_message.EMIT, [_message.envelope(params)])
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
