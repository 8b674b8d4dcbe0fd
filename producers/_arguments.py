"""``publish``'s arguments, checked before any SQL and turned into the statement's parameters.

The limits are the table's own (its CHECK constraints and writer_bounds
trigger), the same on PostgreSQL, MySQL and MariaDB: a value the database
would refuse is refused here, so the caller's transaction is never aborted by
it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from producers import _encoding
from producers._tracing import with_trace_context
from relay.attribute_values import media_type_problem, shown
from relay.stored_text import has_json_nul, has_lone_surrogate, refuse_json_constant

#: The content type of a bytes payload published without one (RFC 2046: arbitrary bytes).
DEFAULT_BYTES_CONTENT_TYPE = "application/octet-stream"
#: Payloads sent as they are, with a content type (a tuple: a union would be built at each call).
BYTES_TYPES = (bytes, bytearray, memoryview)
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


def _payload_params(payload: Any, content_type: str | None) -> dict[str, Any]:
    """The payload's parameters: JSON, or bytes with their content type."""
    if isinstance(payload, BYTES_TYPES):
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
    if isinstance(idempotency_key, _KEY_LIKE) and not isinstance(idempotency_key, bool):
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
        "headers_json": _json_text(headers, "headers") if headers else "{}",  # most events: no encoder run
        "idempotency_key": idempotency_key or uuid4_text(),
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


#: Idempotency keys taken as their text, as the table's text column took them.
_KEY_LIKE = (uuid.UUID, int)
#: ``json.dumps(value, allow_nan=False)``, without building an encoder for every call (json.dumps
#: reuses its own only with no options given).
_ENCODER = json.JSONEncoder(allow_nan=False)


#: A hex digit's low two bits under the variant's 10: 8, 9, a or b.
_VARIANT = dict(zip("0123456789abcdef", "89ab" * 4, strict=True))


def uuid4_text() -> str:
    """A new random UUID (version 4, RFC 4122 variant) as ``str(uuid.uuid4())`` writes it, from the same
    random source: without the ``UUID`` object, 1.25 us instead of 4 (of publish's ~33 us in Python)."""
    text = os.urandom(16).hex()
    # The six bits uuid4() sets: the version digit 4, and the variant's 10 in the top of the next group.
    return f"{text[:8]}-{text[8:12]}-4{text[13:16]}-{_VARIANT[text[16]]}{text[17:20]}-{text[20:]}"


def _json_text(value: Any, what: str) -> str | None:
    """``value`` as the JSON text the database gets; None for a value of a type only the
    connection's own JSON dumper knows (psycopg's ``set_json_dumps``: ``Decimal``, ...).

    Both databases refuse NaN and Infinity (no JSON) and a lone surrogate (no
    text): refused there, they would abort the caller's transaction on
    PostgreSQL, so they are refused here, before any SQL.
    """
    try:
        text = _ENCODER.encode(value)
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


def with_connection_json(conn: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` for a message: a JSON payload ``json`` could not write (``payload_json`` None), as ``conn``'s
    own JSON dumper writes it, as the table's INSERT hands it to that dumper; else the message's payload would
    be null. Its text is checked here: no jsonb column checks a message."""
    if "content_type" in params or params["payload_json"] is not None:
        return params
    text = _encoding.connection_json(conn, params["payload"], "payload")
    return {**params, "payload_json": _checked_dumped(text, "payload")}


def _checked_dumped(text: str, what: str) -> str:
    """JSON text of a connection's dumper, refused where :func:`_json_text` refuses json's (NaN and
    Infinity, a lone surrogate, NUL, MariaDB's depth), and where the relay's decoding would (no JSON)."""
    try:  # numbers as Decimal, as the relay reads an envelope: 1.50 and 1e400 stay what jsonb keeps
        value = json.loads(text, parse_float=Decimal, parse_constant=refuse_json_constant)
    except ValueError as exc:
        raise ValueError(f"{what} as the connection's JSON dumper writes it is not JSON: {exc}") from None
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
    _check_depth(value, text)
    _check_jsonb(text, what)
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
    if has_json_nul(text):
        raise ValueError(f"{what} holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store")


def _check_no_nul(topic: str, key: str | None, idempotency_key: str | None, headers: Mapping[str, str] | None) -> None:
    """Refuse a NUL character in the text columns: PostgreSQL's text cannot hold one, MySQL's would.
    And a lone surrogate, which no database takes: the codec's error named no argument."""
    given = topic + (key or "") + (idempotency_key or "")
    if "\x00" in given or not given.isascii():  # rare: then find which one, and what is wrong with it
        _check_texts(topic, key, idempotency_key)
    for name, value in (headers or {}).items():
        if "\x00" in name or "\x00" in value:
            raise ValueError("a header holds a NUL character (\\x00), which PostgreSQL cannot store")


def _check_texts(topic: str, key: str | None, idempotency_key: str | None) -> None:
    texts = [("topic", topic), ("key", key), ("idempotency_key", idempotency_key)]
    for what, text in texts:
        if text is not None and "\x00" in text:
            raise ValueError(f"{what} holds a NUL character (\\x00), which PostgreSQL cannot store")
        if text is not None and not text.isascii():
            _check_no_lone_surrogate(text, what)


def _check_no_lone_surrogate(text: str, what: str) -> None:
    if has_lone_surrogate(text):
        raise ValueError(f"{what} holds a lone surrogate (\\ud800-\\udfff), which is not text")


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


def _with_default(payload: Any, json_default: Callable[[Any], Any] | None) -> Any:
    """``payload`` with what JSON cannot encode replaced through ``json_default``, if given."""
    if json_default is None or isinstance(payload, BYTES_TYPES):
        return payload
    return _encoding.encoded(payload, json_default, "payload")
