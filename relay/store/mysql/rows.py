"""A MySQL claim's rows: the checks that say which make no event, and the events built from them.

The claim (relay/store/mysql/store.py) checks each row it locked before it
leases it, and dead-letters those no event can be made of; the events of the
rows it leased are built only when the relay asks for them (:class:`Leased`),
so that the relay can send its next claim to the database first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any
from uuid import UUID

from relay.events import Event
from relay.store.base import Claim, in_key_order, next_attempt, tails_of, undecodable
from relay.store.mysql.admin import text, utc

#: How MySQL 8 and MariaDB both write an empty JSON object.
EMPTY_JSON_OBJECT = "{}"

#: An event's id, to sort by.
_BY_ID = attrgetter("id")

#: How much of a bad key's bytes a dead letter's error shows.
SHOWN_BYTES = 64


def unusable(row: dict[str, Any], *, check_payload: bool, check_headers: bool = True) -> str | None:
    """Why no event can be made of a claimed row (None: it can), with its headers parsed into ``headers_parsed``
    (unless ``check_headers`` is false: they were, as :func:`headers_problem` read them late).

    The table's checks leave room for rows the relay cannot send as the
    contract says: ``key`` and ``idempotency_key`` are VARBINARY, so a writer
    whose connection is not UTF-8 can store bytes that are not text; and
    MariaDB's JSON check takes some text that is not JSON (``{"a":1e}``,
    ``[-]``, ``"\\q"``), in ``headers`` and in ``payload``, and a zero
    ``created_at`` (``0000-00-00``, which the driver gives as text). Such a row is
    dead-lettered at its claim, with this for its error. MySQL 8 keeps JSON in
    a binary form and gives it back as JSON it wrote itself: ``check_payload``
    (parsing every payload) is for MariaDB, which keeps the text as written.
    """
    for column in ("key", "idempotency_key"):
        row[column] = value = text(row[column])  # decoded once, for the event too
        if undecodable(value):
            raw = value.encode("utf-8", "surrogateescape")
            more = "..." if len(raw) > SHOWN_BYTES else ""
            return f"{column} is not valid UTF-8 (its bytes in hex: {raw[:SHOWN_BYTES].hex()}{more})"
    if not isinstance(row["created_at"], datetime):  # a zero date, which MariaDB's default sql_mode lets in
        return f"created_at is not a date: {str(row['created_at'])[:40]!r}"
    return (headers_problem(row) if check_headers else None) or (
        payload_problem(row["payload"]) if check_payload else None
    )


def headers_problem(row: dict[str, Any]) -> str | None:
    """Why a row's headers make no event (None: they do), with them parsed into ``headers_parsed``.

    Headers the locking read left out (``None``: too big to bring along) parse as none until they are read.
    """
    headers = row["headers"]
    row["headers_parsed"] = {}
    if headers and headers != EMPTY_JSON_OBJECT:
        try:
            parsed = json.loads(headers, parse_int=_int_or_digits)
        except ValueError as exc:
            return f"headers are not valid JSON, though the database took them: {exc}"
        if not isinstance(parsed, dict):
            return "headers are not a JSON object"
        for name, value in parsed.items():
            if not isinstance(value, str) and not _finite(value):
                return f"header {name[:100]!r} is a number JSON cannot carry (it parses as {value!r})"
        row["headers_parsed"] = parsed
    return None


def payload_problem(payload: str | bytes | None) -> str | None:
    """Why a JSON payload MariaDB took is no JSON (None: it is, or the row has a bytes payload)."""
    if payload is None:
        return None
    if isinstance(payload, str):
        # The scanner json.loads calls, called directly: the same text passes (the same decoder settings, and
        # JSON's whitespace around the value), without json.loads' three Python frames and two regex matches
        # (2.2 -> 1.4 us for a payload of 200 bytes, once a claimed row on MariaDB). Anything it refuses
        # goes the long way below, for the error json.loads gives.
        start = len(payload) - len(payload.lstrip(_JSON_WHITESPACE))
        try:
            end = _scan_once(payload, start)[1]
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(payload) or not payload[end:].lstrip(_JSON_WHITESPACE):
                return None
    try:
        json.loads(payload)  # in C alone: a parse_int hook costs a Python call per number
    except ValueError:
        try:
            # An integer past int()'s digit limit is valid JSON: validity only, with no int().
            json.loads(payload, parse_int=_unconverted)
        except ValueError as exc:
            return f"payload is not valid JSON, though the database took it: {exc}"
    return None


#: json.loads' own decoder and what it skips around a value (json.decoder.WHITESPACE).
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_JSON_WHITESPACE = " \t\n\r"

#: Python's int() refuses longer digit strings (sys.get_int_max_str_digits, 4,300); JSON has no limit.
_INT_DIGITS_MAX = 4000


class _Digits(str):
    """A JSON integer too long for ``int()``, kept as its text: a header value is sent as its JSON text."""

    __slots__ = ()


def _int_or_digits(text: str) -> int | str:
    return int(text) if len(text) <= _INT_DIGITS_MAX else _Digits(text)


def _unconverted(text: str) -> int:
    return 0


def _finite(value: Any) -> bool:
    """Whether ``value``, a parsed header, is written back as JSON (1e400 parses as inf, which is not)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _utf8(json_text: str | bytes) -> bytes:
    """A JSON payload's text as UTF-8: a driver may give it as bytes where the server typed it binary."""
    return json_text.encode() if isinstance(json_text, str) else bytes(json_text)


@dataclass(slots=True)
class Leased:
    """A claim committed, its events built when first asked for (the ``Started`` of relay/store/base.py).

    ``placed`` holds the leased rows in claim order, each with whether it is chained.
    """

    token: UUID
    rows_by_id: dict[int, dict[str, Any]]
    placed: Sequence[tuple[int, bool]]
    reaped: frozenset[int]
    buried: int
    _built: Claim | None = field(default=None, init=False)

    @property
    def rows(self) -> int:
        return len(self.placed)

    def tails(self) -> Claim:
        by_id = self.rows_by_id
        return tails_of(self.token, ((i, by_id[i]["topic"], by_id[i]["key"]) for i, _ in self.placed))

    async def events(self) -> Claim:
        if self._built is None:
            by_id = self.rows_by_id
            events = []
            # A transaction's rows share their created_at (UTC_TIMESTAMP(6) is the statement's): made aware once
            # per run of one value, as datetime.replace costs about a third of the rest of an event.
            naive: Any = None
            aware: Any = None
            priorities = set()
            for i, chained in self.placed:
                row = by_id[i]
                if row["created_at"] != naive:
                    naive = row["created_at"]
                    aware = utc(naive)
                priorities.add(row["priority"])
                # The lease counted an attempt after the rows were read.
                events.append(event(row, chained=chained, attempts=next_attempt(row["attempts"]), created_at=aware))
            if len(priorities) > 1:
                events = in_key_order(events, lambda e: (-by_id[e.id]["priority"], e.id), event=lambda e: e)
            else:
                # One priority: claim order is id order, which keeps each key's order too (what in_key_order
                # gives then, with no Python call per event: 0.4 us of an event's 2).
                events.sort(key=_BY_ID)
            taken_over = frozenset(e.id for e in events if e.id in self.reaped) if self.reaped else frozenset()
            self._built = Claim(token=self.token, events=events, taken_over=taken_over, buried=self.buried)
        return self._built


def event(row: dict[str, Any], *, chained: bool, attempts: int, created_at: datetime | None = None) -> Event:
    """The event of a claimed row that :func:`unusable` passed (``created_at``: its ``created_at`` made aware
    already)."""
    # Parsed when the claim checked the row (unusable); most events have no headers, and skip the comprehension.
    headers = row["headers_parsed"]
    payload = row["payload"]
    return Event(
        id=row["id"],
        topic=row["topic"],
        key=row["key"],
        # JSON as text, or (payload NULL) bytes as they are, with their content type.
        payload=bytes(row["payload_bytes"]) if payload is None else _utf8(payload),
        headers={name: value if isinstance(value, str) else json.dumps(value) for name, value in headers.items()}
        if headers
        else {},
        idempotency_key=text(row["idempotency_key"]),
        attempts=attempts,
        created_at=utc(row["created_at"]) if created_at is None else created_at,
        chained=chained,
        content_type=row["content_type"],
    )
