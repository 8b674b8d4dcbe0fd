"""The log source's pure parts: frames and pgoutput messages, envelopes, the window's confirmable prefix,
and migrate's refusals."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections import deque
from datetime import UTC, datetime, timedelta

import pytest

from relay.config import NATIVE, TableLayout, TableName
from relay.errors import ConfigError
from relay.sources.log import pgoutput
from relay.sources.log.decode import BadEnvelope, RowReader, jsonb_text, message_event, message_idempotency_key
from relay.sources.log.publication import check_slot_name, publication_name, published_columns, refusal
from relay.sources.log.reader import FrameReader
from relay.sources.log.window import Pending, Window

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def _tuple(values: list[str | None]) -> bytes:
    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        else:
            raw = value.encode()
            out += b"t" + struct.pack("!i", len(raw)) + raw
    return out


def test_frames_and_messages_parse() -> None:
    assert pgoutput.parse_frame(b"k" + struct.pack("!Qq?", 42, 0, True)) == pgoutput.Keepalive(42, True)
    frame = pgoutput.parse_frame(b"w" + struct.pack("!QQq", 7, 8, 0) + b"B" + struct.pack("!Qqi", 9, 10, 11))
    assert not isinstance(frame, pgoutput.Keepalive)
    start, payload = frame
    assert start == 7 and pgoutput.parse_message(payload) == pgoutput.Begin(9, 10, 11)
    commit = b"C" + struct.pack("!BQQq", 0, 100, 120, 5)
    assert pgoutput.parse_message(commit) == pgoutput.Commit(100, 120, 5)
    relation = b"R" + struct.pack("!I", 16384) + b"public\x00outbox\x00d" + struct.pack("!h", 2)
    relation += b"\x01id\x00" + struct.pack("!Ii", 20, -1) + b"\x00topic\x00" + struct.pack("!Ii", 25, -1)
    assert pgoutput.parse_message(relation) == pgoutput.Relation(16384, "public", "outbox", ("id", "topic"))
    insert = b"I" + struct.pack("!I", 16384) + b"N" + _tuple(["1", None])
    assert pgoutput.parse_message(insert) == pgoutput.Insert(16384, (b"1", None))
    message = b"M\x01" + struct.pack("!Q", 77) + b"outbox\x00" + struct.pack("!i", 2) + b"{}"
    assert pgoutput.parse_message(message) == pgoutput.Message(True, 77, "outbox", b"{}")
    for skipped in (b"Y", b"O", b"U", b"D", b"T"):
        assert pgoutput.parse_message(skipped + b"\x00" * 8) is None
    with pytest.raises(pgoutput.ProtocolError):
        pgoutput.parse_message(b"Z")
    with pytest.raises(pgoutput.ProtocolError):
        pgoutput.parse_frame(b"x")


def test_status_update_and_lsn_text() -> None:
    frame = pgoutput.standby_status(0x16_B374D848, reply=True)
    kind, written, flushed, applied, _, reply = struct.unpack("!cQQQq?", frame)
    assert (kind, written, flushed, applied, reply) == (b"r", 0x16_B374D848, 0x16_B374D848, 0x16_B374D848, True)
    assert pgoutput.format_lsn(0x16_B374D848) == "16/B374D848"
    assert pgoutput.parse_lsn("16/B374D848") == 0x16_B374D848


COLUMNS = ("id", "topic", "key", "payload", "headers", "idempotency_key", "deliver_at", "priority", "state",
           "attempts", "last_error", "lease_owner", "claim_token", "lease_expires_at", "created_at", "published_at",
           "failed_at", "payload_bytes", "content_type")  # fmt: skip


def _row(**values: str | None) -> tuple[bytes | None, ...]:
    base: dict[str, str | None] = {name: None for name in COLUMNS}
    base.update(id="5", topic="t", key="k", payload='{"a": 1}', headers='{"h": "v"}', idempotency_key="i",
                state="pending", created_at="2026-12-06 21:40:00.123456+00")  # fmt: skip
    base.update(values)
    return tuple(None if base[name] is None else str(base[name]).encode() for name in COLUMNS)


def test_rows_become_events_and_the_relays_own_rows_do_not() -> None:
    reader = RowReader(pgoutput.Relation(1, "public", "outbox", COLUMNS))
    event = reader.event(_row(), NOW)
    assert event is not None
    assert (event.id, event.topic, event.key, event.payload, event.headers, event.idempotency_key) == (
        5, "t", "k", b'{"a": 1}', {"h": "v"}, "i",
    )  # fmt: skip
    assert event.created_at == datetime(2026, 12, 6, 21, 40, 0, 123456, tzinfo=UTC)
    raw = reader.event(_row(payload=None, payload_bytes="\\x00ff", content_type="application/x"), NOW)
    assert raw is not None and raw.payload == b"\x00\xff" and raw.content_type == "application/x"
    assert reader.event(_row(state="failed", last_error="x"), NOW) is None
    assert reader.event(_row(last_error="parked"), NOW) is None
    with pytest.raises(ValueError, match="lacks"):
        RowReader(pgoutput.Relation(1, "public", "outbox", ("id", "topic")))


def test_envelopes() -> None:
    event = message_event(99, json.dumps({"topic": "t", "key": "k", "payload": {"bb": 1, "a": [1.50, "é"]},
                                          "headers": {"h": "v"}}).encode(), NOW)  # fmt: skip
    assert event.payload == '{"a": [1.5, "é"], "bb": 1}'.encode()
    assert event.idempotency_key == message_idempotency_key(99) and event.id == 99 and event.created_at == NOW
    envelope = {"topic": "t", "payload": base64.b64encode(b"\x00\x01").decode(), "content_type": "application/x",
                "idempotency_key": "me"}  # fmt: skip
    raw = message_event(1, json.dumps(envelope).encode(), NOW)
    assert (raw.payload, raw.content_type, raw.idempotency_key, raw.key) == (b"\x00\x01", "application/x", "me", None)
    assert message_event(1, b'{"topic": "t", "payload": null}', NOW).payload == b"null"
    bad = [b"not json", b"[]", b'{"payload": 1}', b'{"topic": "", "payload": 1}', b'{"topic": "t"}',
           b'{"topic": "t", "payload": 1, "key": 3}', b'{"topic": "t", "payload": 1, "headers": {"a": 1}}',
           b'{"topic": "t", "payload": 1, "extra": 1}', b'{"topic": "t", "payload": 1, "content_type": "x"}',
           b'{"topic": "t", "payload": "***", "content_type": "x"}',
           b'{"topic": "t", "payload": 1, "idempotency_key": ""}',
           b'{"topic": "' + b"x" * 250 + b'", "payload": 1}']  # fmt: skip
    for content in bad:
        with pytest.raises(BadEnvelope):
            message_event(1, content, NOW)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
                                      "utf-32-be"])  # fmt: skip
@pytest.mark.parametrize(
    "text",
    [
        '{"topic": "t", "key": "é", "payload": {"a": "€𝄞"}}',
        ' \n\t{"payload": {"a": "€𝄞"}, "key": "é", "topic": "t"}',
        '{"topic":"t","payload":1}',
    ],
)
def test_an_envelope_is_read_in_any_encoding_json_reads_bytes_in(encoding: str, text: str) -> None:
    """As json.loads(bytes): UTF-8 (a BOM or not), UTF-16 and UTF-32 (either order, a BOM or not), from the
    bytea variant of pg_logical_emit_message; the same event as from UTF-8."""
    assert message_event(1, text.encode(encoding), NOW) == message_event(1, text.encode(), NOW)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("where", ['{"payload": %s}', '{"payload": [1, {"x": %s}]}', '{"payload": 1, "key": %s}'])
def test_an_envelope_with_a_number_json_has_not_is_a_bad_one(constant: str, where: str) -> None:
    content = ('{"topic": "t", ' + where[1:]) % constant
    with pytest.raises(BadEnvelope, match=f"{constant} is not a JSON number"):
        message_event(1, content.encode(), NOW)


@pytest.mark.parametrize(
    ("value", "text"),
    [({"b": 1, "aa": 2, "a": 3}, '{"a": 3, "b": 1, "aa": 2}'), ([], "[]"), ({}, "{}"), ("é\n", '"é\\n"'),
     (True, "true"), (None, "null"), ({"x": [{"y": None}]}, '{"x": [{"y": null}]}')],
)  # fmt: skip
def test_jsonb_text_is_what_postgresql_prints(value: object, text: str) -> None:
    assert jsonb_text(value) == text


def test_the_window_confirms_only_the_done_prefix() -> None:
    window = Window(max_events=3, max_bytes=10**9)
    first, second = window.begin(), window.begin()
    a = window.add(message_event(1, b'{"topic": "t", "payload": 1}', NOW), first, row=False)
    b = window.add(message_event(2, b'{"topic": "t", "payload": 2}', NOW), second, row=False)
    c = window.add(message_event(3, b'{"topic": "t", "payload": 3}', NOW), second, row=False)
    assert window.full()
    first.end_lsn, second.end_lsn = 10, 20
    window.done(b)
    window.done(c)
    assert window.confirmable() is None  # the first transaction is not done: nothing after it either
    window.done(a)
    window.done(a)  # twice counts once
    assert window.confirmable() == 20 and window.idle() and window.events == 0
    open_one = window.begin()
    window.done(window.add(message_event(4, b'{"topic": "t", "payload": 4}', NOW), open_one, row=False))
    assert window.confirmable() is None  # its commit has not come yet


def test_refusals_and_names() -> None:
    assert refusal(130000, "logical", True) is not None and "14" in str(refusal(130000, "logical", True))
    assert "wal_level = logical" in str(refusal(150000, "replica", True))
    assert "REPLICATION" in str(refusal(150000, "logical", False))
    assert refusal(180000, "logical", True) is None
    for name in ("", "A", "a-b", "x" * 64, "a b"):
        with pytest.raises(ConfigError):
            check_slot_name(name)
    assert check_slot_name("orders_1") == "orders_1" and publication_name("orders_1") == "orders_1"


@pytest.mark.parametrize(
    ("source", "slot", "error"),
    [("log", None, "needs --slot"), ("logs", None, "invalid --source"), ("table", "a", "goes with --source log"),
     ("log", "Bad-Name", "invalid slot name"), ("log", "x" * 64, "invalid slot name")],
)  # fmt: skip
def test_source_and_slot_refusals(source: str, slot: str | None, error: str) -> None:
    from argparse import Namespace

    from relay.cli.commands import source_and_slot

    with pytest.raises(ConfigError, match=error):
        source_and_slot(Namespace(source=source, slot=slot))


def test_source_and_slot() -> None:
    from argparse import Namespace

    from relay.cli.commands import source_and_slot

    assert source_and_slot(Namespace(source="LOG", slot="orders")) == ("log", "orders")
    assert source_and_slot(Namespace(source="table", slot=None)) == ("table", None)
    assert source_and_slot(Namespace(source=None, slot=None)) == ("table", None)


def test_publish_via_message_refusals() -> None:
    from producers._message import check_via

    assert check_via("table", deliver_at=NOW, priority=5, mysql=True) is False
    assert check_via("message", deliver_at=None, priority=0, mysql=False) is True
    with pytest.raises(ValueError, match="via must be"):
        check_via("row", deliver_at=None, priority=0, mysql=False)
    with pytest.raises(TypeError, match="MySQL"):
        check_via("message", deliver_at=None, priority=0, mysql=True)
    with pytest.raises(ValueError, match="deliver_at"):
        check_via("message", deliver_at=NOW, priority=0, mysql=False)
    with pytest.raises(ValueError, match="priority"):
        check_via("message", deliver_at=None, priority=1, mysql=False)


@pytest.mark.parametrize("payload", [{"b": 1, "a": "é"}, [1, None], None, "text", b"\x00\xffraw"])
def test_an_envelope_reads_back_as_the_event_it_describes(payload: object) -> None:
    from producers._arguments import _params
    from producers._message import envelope

    params = _params("t", payload, None, "k", {"h": "v"}, "idem", None, 0, timedelta(days=1))
    event = message_event(5, envelope(params).encode(), NOW)
    assert (event.topic, event.key, event.headers, event.idempotency_key) == ("t", "k", {"h": "v"}, "idem")
    if isinstance(payload, bytes):
        assert event.payload == payload and event.content_type == "application/octet-stream"
    else:
        assert json.loads(event.payload) == payload and event.content_type is None


DEBEZIUM_COLUMNS = ("id", "aggregatetype", "aggregateid", "type", "payload", "relay_seq", "relay_state",
                    "relay_last_error", "relay_created_at")  # fmt: skip
DEBEZIUM_TYPES = (2950, 1043, 1043, 1043, 3802, 20, 25, 25, 1184)


def _debezium_row(**values: str | None) -> tuple[bytes | None, ...]:
    base: dict[str, str | None] = {
        "id": "0b6f4f9e-2d0a-4a55-9a43-1c3b2e0d7d11", "aggregatetype": "order", "aggregateid": "42", "type": "Made",
        "payload": '{"a": 1}', "relay_seq": "7", "relay_state": "pending", "relay_last_error": None,
        "relay_created_at": "2026-12-06 21:40:00+00",
    }  # fmt: skip
    base.update(values)
    return tuple(None if base[name] is None else str(base[name]).encode() for name in DEBEZIUM_COLUMNS)


def test_debezium_rows_become_the_adapters_events() -> None:
    from relay.config import TableLayout
    from relay.sources.log.debezium import DebeziumRowReader

    relation = pgoutput.Relation(1, "public", "outbox", DEBEZIUM_COLUMNS, DEBEZIUM_TYPES)
    reader = DebeziumRowReader(relation, TableLayout.parse("debezium", field_headers=["type=eventType"]))
    event = reader.event(_debezium_row(), NOW)
    assert event is not None
    assert (event.id, event.topic, event.key, event.payload, event.content_type) == (
        7, "outbox.event.order", "42", b'{"a": 1}', None,
    )  # fmt: skip
    assert event.headers == {"id": event.idempotency_key, "eventType": "Made"}
    assert event.idempotency_key == "0b6f4f9e-2d0a-4a55-9a43-1c3b2e0d7d11"
    # As the view: a null aggregatetype is an empty topic (dead-lettered), an empty one fills in nothing.
    assert (reader.event(_debezium_row(aggregatetype=None), NOW) or event).topic == ""
    assert (reader.event(_debezium_row(aggregatetype=""), NOW) or event).topic == "outbox.event."
    nulls = reader.event(_debezium_row(payload=None, type=None, aggregateid=None), NOW)
    assert nulls is not None and (nulls.payload, nulls.key, nulls.headers) == (b"", None, {"id": nulls.idempotency_key})
    assert reader.event(_debezium_row(relay_state="sent"), NOW) is None
    assert reader.event(_debezium_row(relay_last_error="parked"), NOW) is None
    with pytest.raises(ValueError, match="lacks"):
        DebeziumRowReader(pgoutput.Relation(1, "public", "outbox", DEBEZIUM_COLUMNS[:5]), TableLayout("debezium"))
    with pytest.raises(ValueError, match="no column"):
        DebeziumRowReader(relation, TableLayout.parse("debezium", field_headers=["tenant=t"]))
    with pytest.raises(ValueError, match="payload must be"):
        DebeziumRowReader(
            pgoutput.Relation(1, "public", "outbox", DEBEZIUM_COLUMNS, (*DEBEZIUM_TYPES[:4], 23, *DEBEZIUM_TYPES[5:])),
            TableLayout("debezium"),
        )


def test_an_insert_read_from_its_frame_in_one_pass_is_the_same_event() -> None:
    reader = RowReader(pgoutput.Relation(1, "public", "outbox", COLUMNS))
    for row in (_row(), _row(payload=None, payload_bytes="\\x00ff", content_type="application/x"), _row(key=None)):
        values = [None if value is None else value.decode() for value in row]
        frame = b"w" + struct.pack("!QQq", 7, 8, 0) + b"I" + struct.pack("!I", 1) + b"N" + _tuple(values)
        assert pgoutput.insert_relation(frame, pgoutput.XLOG_HEADER) == 1
        assert reader.event_at(frame, pgoutput.XLOG_HEADER + 6, NOW) == reader.event(row, NOW)
    assert reader.event_at(b"w" + bytes(30) + _tuple([None] * len(COLUMNS)), 31, NOW) is None  # state null
    with pytest.raises(pgoutput.ProtocolError):
        pgoutput.pick_columns(_tuple(["1", "2"]), 0, (0,), 1)  # more columns than its relation
    with pytest.raises(pgoutput.ProtocolError):
        pgoutput.insert_relation(b"I" + struct.pack("!I", 1) + b"K", 0)


def test_rows_added_and_confirmed_a_batch_at_a_time_count_as_one_by_one() -> None:
    window = Window(max_events=3, max_bytes=10**9)
    first, second = window.begin(), window.begin()
    rows = [Pending.of(message_event(i, b'{"topic": "t", "payload": 1}', NOW)) for i in (1, 2, 3)]
    window.add_read(rows[:2], first)
    window.add_read(rows[2:], second)
    assert [(p.seq, p.row, p.done, p.transaction) for p in rows] == [
        (1, True, False, first),
        (2, True, False, first),
        (3, True, False, second),
    ]
    assert window.full() and window.bytes == sum(len(p.payload) + 64 for p in rows)
    first.end_lsn, second.end_lsn = 10, 20
    window.all_done(rows[2:])
    assert window.confirmable() is None  # the first transaction is not done: nothing after it either
    window.all_done(rows)
    window.all_done(rows)  # twice counts once
    assert window.confirmable() == 20 and window.idle() and (window.events, window.bytes) == (0, 0)


def _frame(message: bytes, lsn: int = 0) -> bytes:
    return b"w" + struct.pack("!QQq", lsn, lsn, 0) + message


def _frame_reader(layout: TableLayout) -> tuple[Window, deque[Pending], FrameReader]:
    """A reader of the ``outbox`` table's frames into a window of its own, and the events it makes ready."""
    window = Window(max_events=100, max_bytes=10**9)
    ready: deque[Pending] = deque()
    reader = FrameReader(
        window, ready, TableName.parse("outbox"), layout, batch_size=10, more=asyncio.Event(),
        message_event=lambda lsn, content, at: Pending.of(message_event(lsn, content, at)),
    )  # fmt: skip
    return window, ready, reader


def test_the_reader_keeps_read_order_around_messages_and_hands_out_the_window_entries() -> None:
    """Rows go into the window a run at a time, the runs ended by other messages: ``ready`` keeps the
    order read, and holds the events themselves (one object per event from the reader to the sink)."""
    window, ready, reader = _frame_reader(NATIVE)
    relation = b"R" + struct.pack("!I", 7) + b"public\0outbox\0d" + struct.pack("!h", len(COLUMNS))
    for name in COLUMNS:
        relation += b"\0" + name.encode() + b"\0" + struct.pack("!Ii", 25, -1)

    def insert(row_id: int) -> bytes:
        values = [None if v is None else v.decode() for v in _row(id=str(row_id))]
        return _frame(b"I" + struct.pack("!I", 7) + b"N" + _tuple(values))

    envelope = b'{"topic": "t", "payload": 1}'
    message = b"M\x01" + struct.pack("!Q", 5000) + b"outbox\0" + struct.pack("!i", len(envelope)) + envelope
    reader.take([_frame(relation), _frame(b"B" + struct.pack("!Qqi", 900, 0, 1)), insert(1), insert(2)])
    reader.take([_frame(message, 5000), insert(3), _frame(b"C" + struct.pack("!BQQq", 0, 900, 950, 0)), insert(4)])
    assert [(p.id, p.seq, p.row) for p in ready] == [(1, 1, True), (2, 2, True), (5000, 3, False), (3, 4, True)]
    assert all(p.transaction is ready[0].transaction for p in ready) and ready[0].transaction.pending == 4
    assert ready[0].transaction.end_lsn == 950 and window.events == 4, "a row after the commit is no event"


def test_events_held_behind_a_retry_have_a_bound_of_their_own() -> None:
    window = Window(max_events=10, max_bytes=1 << 20)
    transaction = window.begin()
    event = RowReader(pgoutput.Relation(1, "public", "outbox", COLUMNS)).event(_row(), NOW)
    assert event is not None
    for _ in range(10):
        window.add(event, transaction, row=True)
    assert window.full() and window.room() == 1
    window.held = 10  # all ten wait behind their key's retry: the reader may go on for the other keys
    assert not window.full() and window.room() == 10
    for _ in range(30):
        window.add(event, transaction, row=True)
    window.held = 40
    assert window.full()  # the held ones' own bound: 4 times the window's events


def test_the_column_list_leaves_out_only_the_unread_relay_columns_and_none_before_postgresql_15() -> None:
    native = ["id", "topic", "key", "payload", "deliver_at", "priority", "state", "attempts", "extra"]
    assert published_columns(140000, native) is None
    assert published_columns(150000, native) == ["id", "topic", "key", "payload", "state", "extra"]
    debezium = ["id", "aggregatetype", "priority", "relay_seq", "relay_priority", "relay_state"]
    layout = TableLayout.parse("debezium")
    assert published_columns(170000, debezium, layout) == [
        "id",
        "aggregatetype",
        "priority",
        "relay_seq",
        "relay_state",
    ]


#: Envelopes from plain SQL whose text PostgreSQL could not store (a NUL, a lone surrogate: by escape, or a
#: surrogate's raw bytes) or whose base64 is not ASCII: each is a bad envelope, never an exception of another
#: kind (the reader would stop on it, and read it again after every restart).
UNFIT = [
    rb'{"topic": "t", "payload": {"\ud800": 1}}',
    rb'{"topic": "t", "payload": "\udfff"}',
    rb'{"topic": "t", "payload": [1, {"a": ["x\ud800y"]}]}',
    rb'{"topic": "t", "payload": "a\u0000"}',
    rb'{"topic": "t", "payload": {"a\u0000": 1}}',
    rb'{"topic": "t", "payload": {"a": 1.5, "b": "\u0000"}}',
    rb'{"topic": "t", "payload": {"a": 1.5, "b": "\ud800"}}',
    rb'{"topic": "t\u0000", "payload": 1}',
    rb'{"topic": "\ud800", "payload": 1}',
    rb'{"topic": "t", "key": "a\u0000", "payload": 1}',
    rb'{"topic": "t", "key": "\udbff", "payload": 1}',
    rb'{"topic": "t", "payload": 1, "headers": {"a\u0000": "b"}}',
    rb'{"topic": "t", "payload": 1, "headers": {"a": "\ud800"}}',
    rb'{"topic": "t", "payload": 1, "idempotency_key": "\ud800"}',
    rb'{"topic": "t", "payload": "AA==", "content_type": "\ud800"}',
    rb'{"topic": "t", "payload": "AA==", "content_type": "a\u0000"}',
    b'{"topic": "t", "payload": "\xed\xa0\x80"}',
    '{"topic": "t", "payload": "\u00e9", "content_type": "a/b"}'.encode(),
    b'{"topic": "t", "payload": ' + b"[" * 900 + b"]" * 900 + b"}",
    b'{"topic": "t", "payload": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}",
    b'{"topic": "t", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
]


@pytest.mark.parametrize("content", UNFIT)
def test_an_envelope_postgresql_could_not_store_is_a_bad_one(content: bytes) -> None:
    with pytest.raises(BadEnvelope):
        message_event(1, content, NOW)


@pytest.mark.parametrize(
    ("content", "payload", "key"),
    [
        (rb'{"topic": "t", "key": "\ud83d\ude00", "payload": "\ud83d\ude00"}', '"\U0001f600"', "\U0001f600"),
        (rb'{"topic": "t", "key": "a\\u0000", "payload": "\\u0000"}', '"\\\\u0000"', "a\\u0000"),
        (rb'{"topic": "t", "payload": {"\u00e9": "\u0041"}}', '{"\u00e9": "A"}', None),
    ],
)
def test_escapes_that_spell_text_are_kept(content: bytes, payload: str, key: str | None) -> None:
    event = message_event(1, content, NOW)
    assert (event.payload, event.key) == (payload.encode(), key)


@pytest.mark.parametrize(
    ("transactional", "prefix", "event"),
    [(True, b"outbox", True), (False, b"outbox", False), (True, b"outbox-heartbeat", False), (True, b"outboxx", False),
     (True, b"outbo", False), (True, b"", False), (True, b"Outbox", False), (False, b"outbox-heartbeat", False)],
)  # fmt: skip
def test_only_a_transactional_message_with_the_outbox_prefix_is_an_event(
    transactional: bool, prefix: bytes, event: bool
) -> None:
    """Read straight from the frame as parse_message reads it: the same LSN and content, and None for any other
    message (another prefix, one that merely starts or ends like it, or one outside a transaction)."""
    envelope = b'{"topic": "t", "payload": 1}'
    message = b"M" + bytes([transactional]) + struct.pack("!Q", 5000) + prefix + b"\0"
    message += struct.pack("!i", len(envelope)) + envelope + b"trailing"
    frame = _frame(message, 5000)
    parsed = pgoutput.parse_message(frame[pgoutput.XLOG_HEADER :])
    assert isinstance(parsed, pgoutput.Message) and parsed.content == envelope
    found = pgoutput.transactional_message(frame, pgoutput.XLOG_HEADER, b"outbox")
    assert found == ((parsed.lsn, parsed.content) if event else None)
    for layout, events in ((NATIVE, event), (TableLayout.parse("debezium"), False)):
        _, ready, reader = _frame_reader(layout)
        reader.take([_frame(b"B" + struct.pack("!Qqi", 900, 0, 1)), frame, _frame(message, 5001)])
        assert [(p.id, p.row, p.payload) for p in ready] == ([(5000, False, b"1")] * 2 if events else [])
