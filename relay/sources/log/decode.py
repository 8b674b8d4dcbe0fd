"""Outbox rows and ``outbox`` messages, as decoded from the slot, turned into events.

A row of the outbox table becomes the event the table source would have built
from it: the same id, topic, key, payload bytes (jsonb's text), headers,
idempotency key and creation time. Rows the relay itself wrote (dead letters,
events parked behind one: ``last_error`` set, or a state other than
``pending``) are not events of the log: they are the table's to deliver.

A transactional logical message with the prefix ``outbox`` carries a JSON
envelope (docs/log-source.md)::

    {"topic": "orders", "key": "42", "payload": {...}, "headers": {"a": "b"},
     "idempotency_key": "..."}

or, for a bytes payload, ``"payload": "<base64>"`` with ``"content_type"``. Its
event's id is the message's LSN (unique and increasing, far above any row id
a table holds in practice), and an envelope without an idempotency key gets
one from that LSN, the same on every re-read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from relay.events import Event
from relay.sources.log.pgoutput import Relation, format_lsn, pick_columns
from relay.stored_text import has_json_nul, has_lone_surrogate, refuse_json_constant

#: The prefix of the logical messages that are outbox events.
MESSAGE_PREFIX = "outbox"
#: The prefix of the relay's heartbeats (non-transactional messages that let the slot advance).
HEARTBEAT_PREFIX = "outbox-heartbeat"
TOPIC_MAX_CHARS = 249
IDEMPOTENCY_KEY_MAX_CHARS = 200
CONTENT_TYPE_MAX_BYTES = 255
ENVELOPE_FIELDS = frozenset({"topic", "key", "payload", "headers", "idempotency_key", "content_type"})


class BadEnvelope(ValueError):
    """An ``outbox`` message whose envelope is not one: it is dead-lettered with this reason."""


def message_idempotency_key(lsn: int) -> str:
    """The idempotency key of a message whose envelope has none: from its LSN, the same on every re-read."""
    return f"pg-message-{format_lsn(lsn)}"


def parse_timestamptz(text: str) -> datetime:
    """A timestamptz in ISO style (the stream's DateStyle): ``2026-12-06 21:40:00.123456+00``."""
    stamp = datetime.fromisoformat(text)
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea not in hex form (bytea_output=hex)")
    return bytes.fromhex(text[2:])


#: The columns an event is built from, in the order :meth:`RowReader.event_at` picks them.
_NEEDED = ("id", "topic", "key", "payload", "headers", "idempotency_key", "created_at")
_OPTIONAL = ("state", "last_error", "payload_bytes", "content_type")


class RowReader:
    """Builds events from the outbox table's inserted rows, its columns found by name once per relation."""

    def __init__(self, relation: Relation, make: type[Event] = Event) -> None:
        """``make``: the class of the events built (the log's reader builds its window's entries at once)."""
        self._make = make
        index = {name: i for i, name in enumerate(relation.columns)}
        missing = set(_NEEDED) - index.keys()
        if missing:
            raise ValueError(f"the outbox table {relation.namespace}.{relation.name} lacks {sorted(missing)}")
        picked = _NEEDED + _OPTIONAL
        #: Each column's place among the picked ones (-1: not needed, skipped while parsing).
        self.places = tuple(picked.index(name) if name in picked else -1 for name in relation.columns)
        self._positions = tuple(index.get(name, -1) for name in picked)
        self._has_state = "state" in index
        # Filled anew by each event_at (every place is written): no list is made per row.
        self._values: list[bytes | None] = [None] * len(picked)
        # The last created_at read, and its datetime: a transaction's rows mostly share one (now()).
        self._created: tuple[bytes | None, datetime | None] = (None, None)

    def event(self, values: tuple[bytes | None, ...], commit_time: datetime) -> Event | None:
        """The event of an inserted row (every column's value); None for a row the relay wrote."""
        return self._event([values[i] if i >= 0 else None for i in self._positions], commit_time)

    def event_at(self, data: bytes, at: int, commit_time: datetime) -> Event | None:
        """The event of the insert whose TupleData starts at ``at`` of ``data``, read in one pass."""
        return self._event(pick_columns(data, at, self.places, len(self._positions), self._values), commit_time)

    def _event(self, values: list[bytes | None], commit_time: datetime) -> Event | None:
        row_id, topic, key, payload, headers, idempotency_key, created, state, error, raw, content_type = values
        if (state != b"pending" and self._has_state) or error is not None:
            return None
        if payload is None:
            payload = _bytea(raw.decode() if raw is not None else "\\x")
        if not created:
            created_at = commit_time
        elif created == self._created[0]:
            created_at = self._created[1] or commit_time
        else:
            created_at = parse_timestamptz(created.decode())
            self._created = (created, created_at)
        # By position, in the order of Event's fields: a keyword call costs the event about twice as much.
        return self._make(
            int(row_id or 0),
            topic.decode() if topic else "",
            key.decode() if key is not None else None,
            payload,
            json.loads(headers) if headers and headers != b"{}" else {},
            idempotency_key.decode() if idempotency_key else "",
            0,
            created_at,
            False,
            content_type.decode() if content_type is not None else None,
        )


def message_event(lsn: int, content: bytes, commit_time: datetime, make: type[Event] = Event) -> Event:
    """The event of an ``outbox`` message; raise :class:`BadEnvelope` when its envelope is not one.

    ``make``: the class of the event built (the log's reader builds its window's entry at once)."""
    try:
        # As json.loads reads bytes, but strictly: a surrogate's bytes are no UTF-8. A dict built by the decoder
        # keeps the last of duplicate keys, as jsonb does. An envelope that starts with a printable ASCII byte not
        # followed by a NUL (any UTF-8 text from pg_logical_emit_message) is UTF-8 to json's test too.
        ascii_first = b" " <= content[:1] < b"\x80" and content[1:2] != b"\x00"
        text = content.decode("utf-8" if ascii_first else json.detect_encoding(content))
        envelope = _decode(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadEnvelope(f"the message is not a JSON envelope: {exc}") from None
    except RecursionError:
        raise BadEnvelope(_TOO_DEEP) from None
    if not isinstance(envelope, dict):
        raise BadEnvelope("the message's envelope is not a JSON object")
    unknown = envelope.keys() - ENVELOPE_FIELDS
    if unknown:
        raise BadEnvelope(f"the envelope has unknown fields {sorted(unknown)}")
    # Only an escape (\u0000, or \ud800 unpaired) spells a NUL or a lone surrogate: the tests below run then.
    escaped = "\\u" in text
    topic = envelope.get("topic")
    if not isinstance(topic, str) or not topic or len(topic) > TOPIC_MAX_CHARS:
        raise BadEnvelope(f"the envelope's topic must be a string of 1 to {TOPIC_MAX_CHARS} characters")
    key = envelope.get("key")
    if key is not None and not isinstance(key, str):
        raise BadEnvelope("the envelope's key must be a string or null")
    headers = envelope.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) and n for n, v in headers.items()):
        raise BadEnvelope("the envelope's headers must map non-empty names to strings")
    idempotency_key = envelope.get("idempotency_key")
    if idempotency_key is None:
        idempotency_key = message_idempotency_key(lsn)
    elif not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= IDEMPOTENCY_KEY_MAX_CHARS:
        raise BadEnvelope(f"the envelope's idempotency_key must be a string of 1 to {IDEMPOTENCY_KEY_MAX_CHARS} chars")
    content_type = envelope.get("content_type")
    if content_type is not None and not isinstance(content_type, str):
        raise BadEnvelope(f"the envelope's content_type must be 1 to {CONTENT_TYPE_MAX_BYTES} bytes")
    if escaped:
        _check_texts(topic, key, headers, idempotency_key, content_type)
    if "payload" not in envelope:
        raise BadEnvelope("the envelope has no payload")
    if content_type is None:
        try:
            payload_text = jsonb_text(envelope["payload"])
        except UnicodeEncodeError:  # a key's bytes, in jsonb's order
            raise BadEnvelope(f"the envelope's payload {_UNFIT}") from None
        except RecursionError:
            raise BadEnvelope(_TOO_DEEP) from None
        if escaped:
            _check_payload(payload_text)
        payload = payload_text.encode()
    else:
        if not 0 < len(content_type.encode()) <= CONTENT_TYPE_MAX_BYTES:
            raise BadEnvelope(f"the envelope's content_type must be 1 to {CONTENT_TYPE_MAX_BYTES} bytes")
        if not isinstance(envelope["payload"], str):
            raise BadEnvelope("with a content_type, the envelope's payload is the bytes in base64")
        try:
            payload = base64.b64decode(envelope["payload"], validate=True)
        except ValueError as exc:  # binascii.Error, or a character past ASCII
            raise BadEnvelope(f"the envelope's payload is not base64: {exc}") from None
    # By position, in the order of Event's fields (as RowReader builds them); the headers are the decoder's own.
    return make(lsn, topic, key, payload, headers, idempotency_key, 0, commit_time, False, content_type)


#: Python's recursion limit, reached by arrays or objects some hundreds deep (producers.publish writes at most 31).
_TOO_DEEP = "the envelope's payload is nested too deep for the relay to decode (hundreds of arrays or objects)"
#: The text a NUL or a lone surrogate makes unfit: PostgreSQL stores neither (a table row cannot hold one, a
#: dead letter could not be written), and a table writer's event never carries one.
_UNFIT = "holds a NUL (\\u0000) or a lone surrogate (\\ud800-\\udfff), which PostgreSQL cannot store"


def _check_texts(
    topic: str, key: str | None, headers: dict[str, str], idempotency_key: str, content_type: str | None
) -> None:
    """Raise :class:`BadEnvelope` for the first of the envelope's texts that holds a NUL or a lone surrogate."""
    named = [("topic", topic), ("key", key), ("idempotency_key", idempotency_key), ("content_type", content_type)]
    named += [("headers", text) for pair in headers.items() for text in pair]
    for what, text in named:
        if text is not None and ("\x00" in text or has_lone_surrogate(text)):
            raise BadEnvelope(f"the envelope's {what} {_UNFIT}")


def _check_payload(text: str) -> None:
    """Raise :class:`BadEnvelope` if a JSON payload's text holds a NUL (jsonb refuses \\u0000) or a lone
    surrogate (no UTF-8 has it)."""
    if has_json_nul(text) or has_lone_surrogate(text):
        raise BadEnvelope(f"the envelope's payload {_UNFIT}")


#: Numbers with a fraction or an exponent as Decimal: numeric prints them from their digits, not a float's.
#: ``NaN`` and ``Infinity``, which Python's json reads and JSON has not, make the envelope a bad one.
_decode = json.JSONDecoder(parse_float=Decimal, parse_constant=refuse_json_constant).decode
#: ``json.dumps(..., ensure_ascii=False)`` without building an encoder at each call: ", " and ": " as jsonb.
_json_encode = json.JSONEncoder(ensure_ascii=False).encode
#: The C encoder that ``_json_encode`` builds at each call, built once (where there is one): no check for
#: cycles (a decoded document has none), NaN and Infinity let through (the decoder refused them already).
_c_encode = c_make_encoder and c_make_encoder(None, None, encode_basestring, None, ": ", ", ", False, False, True)


def _encode(value: Any) -> str:
    return "".join(_c_encode(value, 0)) if _c_encode else _json_encode(value)


class _Inexact(Exception):
    """A Decimal in a value: json's encoder cannot print it as numeric does."""


def _jsonb_key(name: str) -> tuple[int, bytes]:
    encoded = name.encode()
    return len(encoded), encoded


def jsonb_text(value: Any) -> str:
    """``value`` (as json decodes it) as PostgreSQL prints it as jsonb: keys shortest first then bytewise,
    ``", "`` and ``": "``.

    The payload of a message event then has the bytes a table row of the same
    payload gets from the jsonb column, so both writers' events look alike.
    Objects are put in jsonb's order and json's C encoder prints the rest; a
    value holding a Decimal (a number with a fraction or an exponent) is
    written piece by piece, its numbers as numeric prints them.
    """
    try:
        return _encode(_in_jsonb_order(value))
    except _Inexact:
        parts: list[str] = []
        _write(value, parts.append)
        return "".join(parts)


def _in_jsonb_order(value: Any) -> Any:
    """``value`` with every object's keys in jsonb's order; raise :class:`_Inexact` at a Decimal."""
    kind = type(value)
    if kind is dict:
        # Code points order as UTF-8 bytes do: only the length differs, and only past ASCII (a C sort then).
        names = sorted(sorted(value), key=len) if "".join(value).isascii() else sorted(value, key=_jsonb_key)
        if _SCALARS.issuperset(map(type, value.values())):  # the common event: one object of strings and integers
            return value if names == list(value) else {name: value[name] for name in names}
        ordered = {}
        for name in names:
            item = value[name]
            ordered[name] = _in_jsonb_order(item) if type(item) in _NOT_SCALARS else item
        return ordered
    if kind is list:
        return [_in_jsonb_order(item) if type(item) in _NOT_SCALARS else item for item in value]
    if kind is Decimal:
        raise _Inexact
    return value


#: What json decodes a document's leaves to (a float only from NaN and Infinity), and what it does not.
_SCALARS = frozenset({str, int, bool, float, type(None)})
_NOT_SCALARS = frozenset({dict, list, Decimal})


def _write(value: Any, out: Callable[[str], None]) -> None:
    if isinstance(value, dict):
        out("{")
        for i, name in enumerate(sorted(value, key=_jsonb_key)):
            if i:
                out(", ")
            out(json.dumps(name, ensure_ascii=False))
            out(": ")
            _write(value[name], out)
        out("}")
    elif isinstance(value, list):
        out("[")
        for i, item in enumerate(value):
            if i:
                out(", ")
            _write(item, out)
        out("]")
    elif isinstance(value, Decimal):
        out(_numeric(value))
    else:
        out(json.dumps(value, ensure_ascii=False))


def _numeric(value: Decimal) -> str:
    """A JSON number as numeric prints it: no exponent (``1e2`` is ``100``), its scale kept, no negative zero."""
    return format(value if value else value.copy_abs(), "f")
