"""Debezium's outbox table on the log source: its inserted rows as events, and the relay's writes to it.

A row becomes the event the table store's Debezium adapter builds from the
same row (:mod:`relay.store.debezium`): the topic from the topic template
with the row's ``aggregatetype``, the key its ``aggregateid``, the payload by
the ``payload`` column's type (JSON as written, text as UTF-8 with
``text/plain``, bytes as they are; null as an empty value), the ``id``
header and idempotency key its uuid, ``--field-header`` columns as headers,
and its id the ``relay_seq`` the relay orders a key's rows by.

The relay's writes go to the relay columns only, never to the application's:
a dead letter is its own row marked ``failed``; an event parked behind one
keeps its row, which takes a new ``relay_seq`` (the key's rows stay in the
order the log gave them) and a ``relay_last_error`` saying why. A re-read
after a crash finds the row already moved, and changes nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import LiteralString

from relay.config import TableLayout
from relay.events import Event
from relay.sources.log.decode import parse_timestamptz
from relay.sources.log.pgoutput import Relation, pick_columns

#: Type oids of the payload types the Debezium layout relays (as relay.store.debezium.PAYLOAD_COLUMNS).
_JSON_TYPES = frozenset({114, 3802})  # json, jsonb
_TEXT_TYPES = frozenset({25, 1043})  # text, character varying
_BYTEA = 17
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
BYTES_CONTENT_TYPE = "application/octet-stream"

#: A dead letter: the row itself, marked failed (through the layout's view, the native column names).
DEAD_LETTER: LiteralString = """
UPDATE {view} SET state = 'failed', attempts = %(attempts)s, last_error = %(last_error)s, failed_at = now(),
    lease_expires_at = NULL, claim_token = NULL, lease_owner = NULL
WHERE id = %(id)s
"""
#: An event parked behind a dead letter: its row, moved to the end of its key's rows.
PARK: LiteralString = """
UPDATE {view} SET id = nextval({seq_name}::regclass), last_error = %(last_error)s, attempts = 0
WHERE id = %(id)s AND state = 'pending' AND last_error IS NULL
"""


class DebeziumRowReader:
    """Builds events from a Debezium outbox table's inserted rows, its columns found by name once per relation."""

    def __init__(self, relation: Relation, layout: TableLayout) -> None:
        index = {name: i for i, name in enumerate(relation.columns)}
        table = f"{relation.namespace}.{relation.name}"
        needed = {"id", "aggregatetype", "aggregateid", "payload", "relay_seq", "relay_state", "relay_last_error",
                  "relay_created_at"}  # fmt: skip
        if missing := needed - index.keys():
            raise ValueError(f"the Debezium outbox table {table} lacks {sorted(missing)} (run outbox-relay migrate)")
        if missing := {column for column, _ in layout.field_headers} - index.keys():
            raise ValueError(f"the Debezium outbox table {table} has no column {sorted(missing)} (--field-header)")
        kind = relation.types[index["payload"]] if relation.types else 0
        if kind not in _JSON_TYPES | _TEXT_TYPES | {_BYTEA}:
            raise ValueError(f"table {table}: payload must be jsonb, json, text or bytea (type oid {kind})")
        self._kind = kind
        self._index = index
        self._template = layout.topic_template
        self._fields = tuple((index[column], header) for column, header in layout.field_headers)
        self._places = tuple(range(len(relation.columns)))

    def event_at(self, data: bytes, at: int, commit_time: datetime) -> Event | None:
        """The event of the insert whose TupleData starts at ``at`` of ``data``."""
        return self.event(tuple(pick_columns(data, at, self._places, len(self._places))), commit_time)

    def event(self, values: tuple[bytes | None, ...], commit_time: datetime) -> Event | None:
        """The event of an inserted row; None for a row not pending (inserted as already sent, or dead)."""
        index = self._index
        if values[index["relay_state"]] != b"pending" or values[index["relay_last_error"]] is not None:
            return None
        raw, content_type = values[index["payload"]], None
        if raw is None:
            payload = b""
        elif self._kind in _JSON_TYPES:
            payload = raw
        elif self._kind in _TEXT_TYPES:
            payload, content_type = raw, TEXT_CONTENT_TYPE
        else:
            text = raw.decode()
            if not text.startswith("\\x"):
                raise ValueError("bytea not in hex form (bytea_output=hex)")
            payload, content_type = bytes.fromhex(text[2:]), BYTES_CONTENT_TYPE
        event_id = (values[index["id"]] or b"").decode()
        headers = {"id": event_id}
        for at, header in self._fields:
            if (value := values[at]) is not None:
                headers[header] = value.decode()
        aggregatetype, key, created = (
            values[index["aggregatetype"]], values[index["aggregateid"]], values[index["relay_created_at"]]
        )  # fmt: skip
        return Event(
            # A null aggregatetype gives an empty topic, as the view's: the sink dead-letters it.
            id=int(values[index["relay_seq"]] or 0),
            topic=self._template.replace("{aggregatetype}", aggregatetype.decode())
            if aggregatetype is not None
            else "",
            key=key.decode() if key is not None else None,
            payload=payload,
            headers=headers,
            idempotency_key=event_id,
            attempts=0,
            created_at=parse_timestamptz(created.decode()) if created else commit_time,
            content_type=content_type,
        )
