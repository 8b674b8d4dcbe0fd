"""Events as CloudEvents: each encoder's message, read back with the CloudEvents SDK's own bindings."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import pika
import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import amqp, kafka
from cloudevents.core.formats.json import JSONFormat
from hypothesis import given
from hypothesis import strategies as st
from pika import frame, spec

from relay.config import Format
from relay.events import Event
from relay.sinks.formats import Rfc3339, amqp_encoder, binary_mode_refusal, kafka_encoder, refusal_of, rfc3339
from relay.sinks.rabbitmq import publish_frames

SOURCE = "/outbox-relay/shop/outbox"
CREATED = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BODY_MAX = 131_072 - 8


def event(
    *,
    key: str | None = "order-7",
    payload: bytes = b'{"total": 12.5, "items": ["\xc3\xa9"]}',
    headers: dict[str, str] | None = None,
    content_type: str | None = None,
) -> Event:
    return Event(
        id=1,
        topic="orders.created",
        key=key,
        payload=payload,
        headers=headers if headers is not None else {},
        idempotency_key="idem-1",
        attempts=0,
        created_at=CREATED,
        content_type=content_type,
    )


def from_kafka(e: Event, chosen: Format) -> tuple[BaseCloudEvent, dict[str, bytes]]:
    value, pairs = kafka_encoder(chosen, SOURCE)(e)
    headers = {name: v.encode() if isinstance(v, str) else (v or b"") for name, v in pairs}
    assert len(headers) == len(pairs), f"duplicate headers in {pairs}"
    key = e.key.encode() if e.key is not None else None
    message = kafka.KafkaMessage(headers=headers, key=key, value=value)
    if chosen is Format.CLOUDEVENTS:
        return kafka.from_binary(message, JSONFormat()), headers
    return kafka.from_structured(message, JSONFormat()), headers


def from_amqp(e: Event, chosen: Format) -> tuple[BaseCloudEvent, str | None, dict[str, str]]:
    body, content_type, headers = amqp_encoder(chosen, SOURCE)(e)
    # A message without the property has no content-type for the SDK (None is no content type).
    properties = {"content-type": content_type} if content_type is not None else {}
    message = amqp.AMQPMessage(properties=properties, application_properties=dict(headers), application_data=body)
    return amqp.from_amqp(message, JSONFormat()), content_type, headers


def assert_attributes(
    ce: BaseCloudEvent, *, content_type: str = "application/json", key: str | None = "order-7"
) -> None:
    assert ce.get_specversion() == "1.0"
    assert ce.get_id() == "idem-1"
    assert ce.get_type() == "orders.created"
    assert ce.get_source() == SOURCE
    assert ce.get_time() == CREATED
    assert ce.get_datacontenttype() == content_type
    assert ce.get_extension("partitionkey") == key


@pytest.mark.parametrize("chosen", [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED])
def test_kafka_json_event(chosen: Format) -> None:
    ce, headers = from_kafka(event(headers={"traceparent": TRACEPARENT, "tenant": "t1"}), chosen)
    assert_attributes(ce)
    assert ce.get_data() == {"total": 12.5, "items": ["é"]}
    assert ce.get_extension("traceparent") == TRACEPARENT
    # The relay's own headers stay: the row's and the idempotency key.
    assert headers["idempotency-key"] == b"idem-1"
    assert headers["tenant"] == b"t1"
    assert headers["traceparent"] == TRACEPARENT.encode()
    expected = b"application/json" if chosen is Format.CLOUDEVENTS else b"application/cloudevents+json"
    assert headers["content-type"] == expected


def test_kafka_binary_mode_forwards_the_payload_untouched() -> None:
    payload = b'{"b":1,  "a" : [1,2]}'
    value, pairs = kafka_encoder(Format.CLOUDEVENTS, SOURCE)(event(payload=payload))
    assert value is payload
    assert dict(pairs)["ce_time"] == "2026-12-01T09:30:15.123456Z"
    assert [name for name, _ in pairs if name.startswith("ce_")] == [
        "ce_specversion",
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_time",
        "ce_partitionkey",
    ]


@pytest.mark.parametrize("chosen", [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED])
def test_kafka_bytes_event_keeps_its_bytes_and_content_type(chosen: Format) -> None:
    raw = b"\x00\x01\xff protobuf"
    ce, _ = from_kafka(event(payload=raw, content_type="application/x-protobuf", key=None), chosen)
    assert_attributes(ce, content_type="application/x-protobuf", key=None)
    assert ce.get_data() == raw


def test_structured_mode_puts_bytes_in_data_base64_and_json_in_data() -> None:
    encode = kafka_encoder(Format.CLOUDEVENTS_STRUCTURED, SOURCE)
    raw = b'{"looks": "like json"}'
    document = json.loads(encode(event(payload=raw, content_type="application/json"))[0])
    assert base64.b64decode(document["data_base64"]) == raw
    assert "data" not in document
    document = json.loads(encode(event())[0])
    assert document["data"] == {"total": 12.5, "items": ["é"]}
    assert "data_base64" not in document
    assert "traceparent" not in document


def test_a_rows_headers_do_not_override_the_cloudevents_ones() -> None:
    row = {"content-type": "text/plain", "ce_id": "forged", "CE_type": "forged", "cloudEvents:id": "forged"}
    ce, headers = from_kafka(event(headers=row), Format.CLOUDEVENTS)
    assert ce.get_id() == "idem-1"
    assert ce.get_type() == "orders.created"
    assert headers["content-type"] == b"application/json"
    assert "CE_type" not in headers
    assert headers["cloudEvents:id"] == b"forged"  # an AMQP name means nothing on Kafka
    ce, _, amqp_headers = from_amqp(event(headers=row), Format.CLOUDEVENTS)
    assert ce.get_id() == "idem-1"
    assert amqp_headers["content-type"] == "text/plain"  # a plain header on AMQP: the property is content_type


@pytest.mark.parametrize("chosen", [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED])
def test_amqp_json_event(chosen: Format) -> None:
    ce, content_type, headers = from_amqp(event(headers={"traceparent": TRACEPARENT}), chosen)
    assert_attributes(ce)
    assert ce.get_data() == {"total": 12.5, "items": ["é"]}
    assert ce.get_extension("traceparent") == TRACEPARENT
    assert headers["idempotency-key"] == "idem-1"
    if chosen is Format.CLOUDEVENTS:
        assert content_type == "application/json"
        assert headers["cloudEvents:id"] == "idem-1"
        assert headers["cloudEvents:time"] == "2026-12-01T09:30:15.123456Z"
    else:
        assert content_type == "application/cloudevents+json"
        assert not [name for name in headers if name.startswith("cloudEvents:")]


def test_amqp_bytes_event() -> None:
    raw = bytes(range(256))
    body, content_type, _ = amqp_encoder(Format.CLOUDEVENTS, SOURCE)(event(payload=raw, content_type="image/png"))
    assert (body, content_type) == (raw, "image/png")
    ce, _, _ = from_amqp(event(payload=raw, content_type="image/png"), Format.CLOUDEVENTS_STRUCTURED)
    assert ce.get_data() == raw
    assert ce.get_datacontenttype() == "image/png"


def test_native_is_todays_shape_plus_a_content_type_for_bytes() -> None:
    e = event(headers={"tenant": "t1"})
    assert kafka_encoder(Format.NATIVE)(e) == (e.payload, [("tenant", "t1"), ("idempotency-key", "idem-1")])
    assert amqp_encoder(Format.NATIVE)(e) == (
        e.payload,
        "application/json",
        {"tenant": "t1", "idempotency-key": "idem-1"},
    )
    raw = event(payload=b"\x00", content_type="application/octet-stream")
    assert ("content-type", "application/octet-stream") in kafka_encoder(Format.NATIVE)(raw)[1]
    assert amqp_encoder(Format.NATIVE)(raw)[1] == "application/octet-stream"


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (CREATED, "2026-12-01T09:30:15.123456Z"),
        (CREATED.replace(microsecond=0), "2026-12-01T09:30:15.000000Z"),
        (CREATED.replace(microsecond=999_999), "2026-12-01T09:30:15.999999Z"),
        (CREATED.astimezone(timezone(timedelta(hours=9))), "2026-12-01T09:30:15.123456Z"),
        (CREATED.astimezone(timezone(timedelta(hours=-3, minutes=-30))), "2026-12-01T09:30:15.123456Z"),
        (CREATED.replace(tzinfo=None), "2026-12-01T09:30:15.123456Z"),
        (datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=UTC), "1999-12-31T23:59:59.000001Z"),
        (datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC), "1969-12-31T23:59:59.500000Z"),
        (datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=UTC), "1900-01-01T00:00:00.000001Z"),
        (datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), "9999-12-31T23:59:59.999999Z"),
        (datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000000Z"),
        (datetime(999, 1, 2, 3, 4, 5, 6), "0999-01-02T03:04:05.000006Z"),
    ],
)
def test_rfc3339(moment: datetime, text: str) -> None:
    assert rfc3339(moment) == text


def iso_utc(moment: datetime) -> str:
    """What rfc3339 must give, the slow way: datetime's own formatting of the time in UTC."""
    utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return utc.isoformat(timespec="microseconds").replace("+00:00", "Z")


def in_utc_range(moment: datetime) -> bool:
    try:
        iso_utc(moment)
    except OverflowError:  # an offset pushes it past year 1 or 9999: no datetime holds it in UTC
        return False
    return True


ZONES = st.one_of(
    st.none(),
    st.just(UTC),
    st.builds(
        timezone, st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59))
    ),
)


@given(st.lists(st.datetimes(timezones=ZONES).filter(in_utc_range), min_size=1, max_size=20))
def test_rfc3339_is_the_time_in_utc_for_every_year_and_zone(moments: list[datetime]) -> None:
    # Before 1970 (a float timestamp truncated a second late), up to 9999-12-31T23:59:59.999999
    # (it rounded into year 10000) and from year 1 (four digits), through one clock and its cache.
    clock = Rfc3339()
    assert [clock(m) for m in moments] == [iso_utc(m) for m in moments]
    assert [clock(m) for m in reversed(moments)] == [iso_utc(m) for m in reversed(moments)]


def test_rfc3339_keeps_each_seconds_part_apart() -> None:
    clock = Rfc3339()
    times = [CREATED + timedelta(microseconds=step) for step in range(0, 3_000_000, 250_001)]
    assert [clock(t) for t in times] == [t.isoformat().replace("+00:00", "Z") for t in times]
    assert clock(CREATED - timedelta(days=1)) == "2026-11-30T09:30:15.123456Z"


@pytest.mark.parametrize("chosen", list(Format))
def test_amqp_frames_are_pikas_byte_for_byte_in_every_format(chosen: Format) -> None:
    e = event(headers={"traceparent": TRACEPARENT, "note": "ünïcode"})
    encode = amqp_encoder(chosen, SOURCE)
    body, content_type, headers = encode(e)
    properties = pika.BasicProperties(
        content_type=content_type, delivery_mode=2, message_id=e.idempotency_key, headers=headers
    )
    publish = spec.Basic.Publish(exchange="ex", routing_key=e.topic, mandatory=True)
    expected = [frame.Method(3, publish).marshal(), frame.Header(3, len(body), properties).marshal()]
    expected.append(frame.Body(3, body).marshal())
    assert publish_frames(3, "ex", e, BODY_MAX, encode) == b"".join(expected)


CE_FORMATS = [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED]
#: Row headers a consumer could take for the relay's: its idempotency key, and attributes under either
#: prefix the AMQP binding's readers take (the CNCF SDK reads cloudEvents_ as well as cloudEvents:).
FORGING_ROWS = [
    {"idempotency-key": "upstream-1"},
    {"idempotency-key": "upstream-1", "ce_id": "forged"},
    {"cloudEvents_id": "forged", "cloudEvents_type": "forged.type", "cloudEvents_source": "/forged"},
    {"cloudEvents:id": "forged", "cloudEvents_time": "2000-01-01T00:00:00Z", "idempotency-key": ""},
    {"cloudEvents_partitionkey": "other", "cloudEvents_specversion": "0.3", "tenant": "acme"},
]


@pytest.mark.parametrize("chosen", CE_FORMATS)
@pytest.mark.parametrize("row", FORGING_ROWS)
def test_a_row_can_neither_forge_an_attribute_nor_add_a_second_idempotency_key(
    chosen: Format, row: dict[str, str]
) -> None:
    ce, headers = from_kafka(event(headers=row), chosen)  # from_kafka fails on any header sent twice
    assert_attributes(ce)
    assert headers["idempotency-key"] == b"idem-1"
    ce, _, amqp_headers = from_amqp(event(headers=row), chosen)
    assert_attributes(ce)
    assert amqp_headers["idempotency-key"] == "idem-1"
    assert not [name for name in amqp_headers if name.startswith("cloudEvents_")]
    assert amqp_headers.get("tenant") == row.get("tenant")


@pytest.mark.parametrize("chosen", CE_FORMATS)
@pytest.mark.parametrize("key", ["", None])
def test_an_empty_or_null_key_gives_no_partitionkey(chosen: Format, key: str | None) -> None:
    # The partitioning extension's value must be a non-empty string; the table takes '' as a key.
    # (On Kafka the SDK reads partitionkey from the message key itself, which stays the event's.)
    value, pairs = kafka_encoder(chosen, SOURCE)(event(key=key))
    assert "ce_partitionkey" not in dict(pairs)
    if chosen is Format.CLOUDEVENTS_STRUCTURED:
        assert "partitionkey" not in json.loads(value)
    ce, _, amqp_headers = from_amqp(event(key=key), chosen)
    assert_attributes(ce, key=None)
    assert "cloudEvents:partitionkey" not in amqp_headers


@pytest.mark.parametrize("chosen", CE_FORMATS)
def test_an_empty_payload_without_a_content_type_is_an_event_without_data(chosen: Format) -> None:
    # A Debezium row's null payload: nothing to wrap, and no content type to claim for it.
    ce, headers = from_kafka(event(payload=b""), chosen)
    assert ce.get_data() is None and ce.get_datacontenttype() is None
    assert ce.get_id() == "idem-1"
    if chosen is Format.CLOUDEVENTS:
        assert "content-type" not in headers
    else:
        value, _ = kafka_encoder(chosen, SOURCE)(event(payload=b""))
        assert "data" not in json.loads(value)
    ce, content_type, _ = from_amqp(event(payload=b""), chosen)
    assert ce.get_data() is None and ce.get_id() == "idem-1"
    if chosen is Format.CLOUDEVENTS:
        assert content_type is None  # no content_type property, as no content-type header on Kafka


@pytest.mark.parametrize("chosen", [Format.NATIVE, Format.CLOUDEVENTS])
@pytest.mark.parametrize("headers", [{}, {"tenant": "t1"}, {"content-type": "text/plain", "traceparent": TRACEPARENT}])
def test_amqp_sends_no_content_type_for_an_empty_payload_without_one(chosen: Format, headers: dict[str, str]) -> None:
    encode = amqp_encoder(chosen, SOURCE)
    assert encode(event(payload=b"", headers=headers))[1] is None
    # Bytes keep theirs even when empty, and a JSON payload is never empty.
    assert encode(event(payload=b"", content_type="application/x-protobuf"))[1] == "application/x-protobuf"
    assert encode(event(payload=b"{}", headers=headers))[1] == "application/json"


#: "idempotency-key" in any mix of cases, the exact name among them.
IDEMPOTENCY_NAMES = st.lists(st.booleans(), min_size=15, max_size=15).map(
    lambda upper: "".join(c.upper() if u else c for c, u in zip("idempotency-key", upper, strict=True))
)


@given(st.sampled_from(list(Format)), st.lists(IDEMPOTENCY_NAMES, min_size=1, max_size=3, unique=True))
def test_a_message_carries_one_idempotency_key_whatever_the_case_of_a_rows(chosen: Format, names: list[str]) -> None:
    # Consumers often look headers up without regard to case: one of these would read the row's.
    row = {name: "upstream" for name in names} | {"tenant": "t1"}
    e = event(headers=row)
    _, pairs = kafka_encoder(chosen, SOURCE)(e)
    assert [(n, v) for n, v in pairs if n.lower() == "idempotency-key"] == [("idempotency-key", "idem-1")]
    assert ("tenant", "t1") in pairs
    _, _, headers = amqp_encoder(chosen, SOURCE)(e)
    assert [(n, v) for n, v in headers.items() if n.lower() == "idempotency-key"] == [("idempotency-key", "idem-1")]
    assert headers["tenant"] == "t1"


def any_case(text: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(text), max_size=len(text)).map(
        lambda upper: "".join(c.upper() if u else c for c, u in zip(text, upper, strict=True))
    )


#: Content types that name a CloudEvents format, in any case, with any format suffix or parameter.
CLOUDEVENTS_TYPES = st.builds(
    "".join,
    st.tuples(
        st.sampled_from(["", " ", "\t"]),
        any_case("application/cloudevents"),
        st.sampled_from(["", "+json", "-batch+json", "+avro", "+protobuf", "; charset=utf-8", "+json; x=1"]),
    ),
)


@given(CLOUDEVENTS_TYPES)
def test_binary_mode_refuses_a_payload_whose_content_type_names_a_cloudevents_format(content_type: str) -> None:
    # Read as binary mode's datacontenttype it makes the message a structured one, the payload its event.
    forged = b'{"specversion":"1.0","id":"forged","source":"/forged","type":"forged"}'
    e = event(payload=forged, content_type=content_type)
    why = binary_mode_refusal(e)
    assert why is not None and repr(content_type[:60]) in why and "format=cloudevents-structured" in why
    refuse = refusal_of(Format.CLOUDEVENTS)
    assert refuse is not None and refuse(e) == why  # the sinks' check: this reason first
    assert refusal_of(Format.NATIVE) is None
    # Structured mode sends it as written, in data_base64, under the relay's attributes.
    ce, _ = from_kafka(e, Format.CLOUDEVENTS_STRUCTURED)
    assert (ce.get_id(), ce.get_data(), ce.get_datacontenttype()) == ("idem-1", forged, content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/cloudevent",
        "application/x-cloudevents+json",
        "text/application/cloudevents",
        "application/octet-stream; note=application/cloudevents",
    ],
)
def test_binary_mode_takes_every_other_content_type(content_type: str | None) -> None:
    assert binary_mode_refusal(event(content_type=content_type)) is None
