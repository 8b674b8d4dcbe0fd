"""CloudEvents on real brokers: the relay's messages read back with the CloudEvents SDK's bindings.

Kafka (Tansu) and RabbitMQ, binary and structured mode, each picked per route
by its sink URL's ``format=``; JSON rows relayed from PostgreSQL end to end,
and payloads of raw bytes through the sinks themselves.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import psycopg
import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import amqp, kafka
from cloudevents.core.formats.json import JSONFormat

import producers
from relay.config import Format, TableName, default_event_source, parse_sink_url
from relay.events import Event, Failure
from relay.sinks import build_sink
from tests.integration.kafka_support import Received, consume, make_event, unique_topic
from tests.integration.rabbit_support import Message, temp_exchange, temp_queue
from tests.relay_support import RelayThread, outbox_counts, wait_until

pytestmark = pytest.mark.timeout(90)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
RAW = b"\x00\x01\x02\xfe\xff not json"


def write_orders(database_url: str, topics: list[str]) -> dict[str, datetime]:
    """Two events per topic (one keyed, with trace context; one without a key); their creation times."""
    with psycopg.connect(database_url) as conn:
        for topic in topics:
            producers.publish(
                conn,
                topic,
                {"order": 7, "total": "12.50", "é": "ü"},
                key="order-7",
                headers={"traceparent": TRACEPARENT, "tenant": "t1"},
                idempotency_key=f"{topic}-keyed",
            )
            producers.publish(conn, topic, [1, 2, 3], idempotency_key=f"{topic}-unkeyed")
        rows = conn.execute("SELECT idempotency_key, created_at FROM outbox").fetchall()
    return {key: created for key, created in rows}


def kafka_event(message: Received) -> BaseCloudEvent:
    """A message as a Kafka consumer that knows CloudEvents reads it (the mode from its headers)."""
    return kafka.from_kafka(
        kafka.KafkaMessage(headers=message.headers, key=message.key, value=message.value), JSONFormat()
    )


def structured_event(message: Received) -> BaseCloudEvent:
    """A message read as a structured-mode CloudEvent only."""
    return kafka.from_structured(
        kafka.KafkaMessage(headers=message.headers, key=message.key, value=message.value), JSONFormat()
    )


def amqp_event(message: Message) -> BaseCloudEvent:
    """A message as a RabbitMQ consumer that knows CloudEvents reads it (the mode from its content type)."""
    return amqp.from_amqp(
        amqp.AMQPMessage(
            properties={"content-type": message.content_type} if message.content_type is not None else {},
            application_properties=message.headers,
            application_data=message.body,
        ),
        JSONFormat(),
    )


def check_orders(events: dict[str, BaseCloudEvent], topic: str, created: dict[str, datetime], source: str) -> None:
    keyed, unkeyed = events[f"{topic}-keyed"], events[f"{topic}-unkeyed"]
    for ce, idempotency_key in ((keyed, f"{topic}-keyed"), (unkeyed, f"{topic}-unkeyed")):
        assert ce.get_specversion() == "1.0"
        assert ce.get_id() == idempotency_key
        assert ce.get_type() == topic
        assert ce.get_source() == source
        assert ce.get_time() == created[idempotency_key]
        assert ce.get_datacontenttype() == "application/json"
    assert keyed.get_extension("partitionkey") == "order-7"
    assert keyed.get_extension("traceparent") == TRACEPARENT
    assert keyed.get_data() == {"order": 7, "total": "12.50", "é": "ü"}
    assert unkeyed.get_extension("partitionkey") is None
    assert unkeyed.get_extension("traceparent") is None
    data: object = unkeyed.get_data()  # the SDK types data as a dict, but JSON may be an array
    assert data == [1, 2, 3]


def test_kafka_routes_each_in_its_own_format(database_url: str, kafka_bootstrap: str) -> None:
    binary, structured, native = unique_topic("ce-bin"), unique_topic("ce-st"), unique_topic("native")
    created = write_orders(database_url, [binary, structured, native])
    routes = [
        f"ce-bin-*=kafka://{kafka_bootstrap}?format=cloudevents",
        f"ce-st-*=kafka://{kafka_bootstrap}?format=cloudevents-structured&linger.ms=1",
    ]
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}", routes=routes):
        wait_until(lambda: not outbox_counts(database_url))
        received = consume(kafka_bootstrap, [binary, structured, native], count=6)
    by_topic: dict[str, list[Received]] = {}
    for message in received:
        by_topic.setdefault(message.topic, []).append(message)
    assert sorted(map(len, by_topic.values())) == [2, 2, 2]
    source = default_event_source(database_url, TableName.parse("outbox"))
    assert source.startswith("/outbox-relay/outbox_relay_t_") and source.endswith("/outbox")

    for message in by_topic[binary]:
        assert message.headers["content-type"] == b"application/json"
        assert message.headers["ce_source"] == source.encode()
        assert message.headers["idempotency-key"] == message.headers["ce_id"]
    keyed = next(m for m in by_topic[binary] if m.key is not None)
    assert keyed.headers["tenant"] == b"t1" and keyed.headers["traceparent"] == TRACEPARENT.encode()
    check_orders(
        {m.headers["idempotency-key"].decode(): kafka_event(m) for m in by_topic[binary]}, binary, created, source
    )

    for message in by_topic[structured]:
        assert message.headers["content-type"] == b"application/cloudevents+json"
        assert not [name for name in message.headers if name.startswith("ce_")]
    # Read as structured whatever the headers say: the value alone must carry the event.
    events = {m.headers["idempotency-key"].decode(): structured_event(m) for m in by_topic[structured]}
    check_orders(events, structured, created, source)

    for message in by_topic[native]:  # today's shape, untouched
        assert set(message.headers) <= {"idempotency-key", "traceparent", "tenant"}
        assert not message.value.startswith(b'{"specversion"')


def test_rabbitmq_binary_and_structured(database_url: str, amqp_url: str) -> None:
    binary, structured = unique_topic("ce-bin"), unique_topic("ce-st")
    created = write_orders(database_url, [binary, structured])
    source = "urn:shop:orders"
    with (
        temp_exchange(amqp_url) as exchange,
        temp_queue(amqp_url, exchange=exchange, routing_keys=[binary, structured]) as queue,
    ):
        routes = [
            f"ce-bin-*={amqp_url}?exchange={exchange}&format=cloudevents",
            f"ce-st-*={amqp_url}?exchange={exchange}&format=cloudevents-structured",
        ]
        with RelayThread(database_url, "", routes=routes, event_source=source):
            wait_until(lambda: not outbox_counts(database_url))
            messages = queue.collect(4)
    assert len(messages) == 4
    for message in messages:
        assert message.delivery_mode == 2
        assert message.headers["idempotency-key"] == message.message_id
    binaries = [m for m in messages if m.routing_key == binary]
    for message in binaries:
        assert message.content_type == "application/json"
        assert message.headers["cloudEvents:id"] == message.message_id
        assert message.headers["cloudEvents:source"] == source
    check_orders({m.message_id or "": amqp_event(m) for m in binaries}, binary, created, source)
    structureds = [m for m in messages if m.routing_key == structured]
    for message in structureds:
        assert message.content_type == "application/cloudevents+json"
        assert not [name for name in message.headers if name.startswith("cloudEvents:")]
    check_orders({m.message_id or "": amqp_event(m) for m in structureds}, structured, created, source)


def bytes_events(topic: str) -> list[Event]:
    raw = make_event(topic, key="k-1", payload=RAW)
    raw.content_type = "application/x-protobuf"
    return [raw, make_event(topic, key="k-1")]


async def publish(sink_url: str, events: list[Event]) -> None:
    sink = build_sink(parse_sink_url(sink_url), publish_timeout_seconds=5, event_source="/bytes")
    await sink.start()
    try:
        assert await sink.publish(events) == [None] * len(events)
    finally:
        await sink.close()


def check_bytes(events: list[Event], decoded: list[BaseCloudEvent]) -> None:
    raw, json_event = decoded
    assert raw.get_id() == events[0].idempotency_key
    assert raw.get_datacontenttype() == "application/x-protobuf"
    assert raw.get_data() == RAW
    assert raw.get_source() == "/bytes"
    assert json_event.get_datacontenttype() == "application/json"
    assert json_event.get_data() == {"n": events[1].id}


@pytest.mark.parametrize("chosen", [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED])
def test_kafka_bytes_payloads(kafka_bootstrap: str, chosen: Format) -> None:
    topic = unique_topic()
    events = bytes_events(topic)
    asyncio.run(publish(f"kafka://{kafka_bootstrap}?format={chosen.value}", events))
    received = consume(kafka_bootstrap, topic, count=2)
    if chosen is Format.CLOUDEVENTS:
        assert received[0].value == RAW
        assert received[0].headers["content-type"] == b"application/x-protobuf"
    check_bytes(events, [kafka_event(m) for m in received])


@pytest.mark.parametrize("chosen", [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED])
def test_rabbitmq_bytes_payloads(amqp_url: str, chosen: Format) -> None:
    with temp_queue(amqp_url) as queue:
        events = bytes_events(queue.name)
        asyncio.run(publish(f"{amqp_url}?format={chosen.value}", events))
        messages = queue.collect(2)
    if chosen is Format.CLOUDEVENTS:
        assert (messages[0].body, messages[0].content_type) == (RAW, "application/x-protobuf")
    check_bytes(events, [amqp_event(m) for m in messages])


@pytest.mark.parametrize("chosen", [Format.NATIVE, Format.CLOUDEVENTS])
def test_rabbitmq_sends_no_content_type_for_an_empty_payload_without_one(amqp_url: str, chosen: Format) -> None:
    # A Debezium row's null payload is no JSON: no content_type, as no content-type header on Kafka.
    with temp_queue(amqp_url) as queue:
        empty = make_event(queue.name, key="k-1", payload=b"")
        empty_bytes = make_event(queue.name, key="k-1", payload=b"")
        empty_bytes.content_type = "application/octet-stream"
        events = [empty, empty_bytes, make_event(queue.name, key="k-1")]
        asyncio.run(publish(f"{amqp_url}?format={chosen.value}", events))
        messages = queue.collect(3)
    assert [(m.body, m.content_type) for m in messages] == [
        (b"", None),
        (b"", "application/octet-stream"),
        (events[2].payload, "application/json"),
    ]
    if chosen is Format.CLOUDEVENTS:
        ce = amqp_event(messages[0])
        assert ce.get_id() == empty.idempotency_key and ce.get_datacontenttype() is None and ce.get_data() is None


ROW_IDEMPOTENCY_KEYS = [
    {"Idempotency-Key": "upstream"},
    {"IDEMPOTENCY-KEY": "a", "idempotency-Key": "b", "tenant": "t1"},
]


@pytest.mark.parametrize("chosen", list(Format))
def test_a_rows_idempotency_key_in_any_case_gives_way_to_the_relays(
    kafka_bootstrap: str, amqp_url: str, chosen: Format
) -> None:
    # Consumers often look headers up without regard to case: one of two would read the row's.
    topic = unique_topic()
    kafka_events = [make_event(topic, key="k-1", headers=row) for row in ROW_IDEMPOTENCY_KEYS]
    asyncio.run(publish(f"kafka://{kafka_bootstrap}?format={chosen.value}", kafka_events))
    received = consume(kafka_bootstrap, topic, count=len(kafka_events))
    with temp_queue(amqp_url) as queue:
        amqp_events = [make_event(queue.name, key="k-1", headers=row) for row in ROW_IDEMPOTENCY_KEYS]
        asyncio.run(publish(f"{amqp_url}?format={chosen.value}", amqp_events))
        messages = queue.collect(len(amqp_events))
    for kafka_message, sent in zip(received, kafka_events, strict=True):
        assert [name for name in kafka_message.headers if name.lower() == "idempotency-key"] == ["idempotency-key"]
        assert kafka_message.headers["idempotency-key"] == sent.idempotency_key.encode()
    assert received[1].headers["tenant"] == b"t1"
    for amqp_message, sent in zip(messages, amqp_events, strict=True):
        assert [name for name in amqp_message.headers if name.lower() == "idempotency-key"] == ["idempotency-key"]
        assert amqp_message.headers["idempotency-key"] == sent.idempotency_key
    assert messages[1].headers["tenant"] == "t1"


#: Content types a reader of either binding takes for structured mode, in binary mode's content-type.
CLOUDEVENTS_CONTENT_TYPES = [
    "application/cloudevents+json",
    "Application/CloudEvents+JSON",
    "application/cloudevents-batch+json",
    "APPLICATION/CLOUDEVENTS+avro",
]
FORGED = b'{"specversion":"1.0","id":"forged","source":"/forged","type":"forged.type","data":{}}'


def forging_events(topic: str) -> list[Event]:
    """A JSON event, then one of each CloudEvents content type carrying a forged event, each its own key."""
    events = [make_event(topic, key="k-json")]
    for n, content_type in enumerate(CLOUDEVENTS_CONTENT_TYPES):
        event = make_event(topic, key=f"k-{n}", payload=FORGED)
        event.content_type = content_type
        events.append(event)
    return events


async def outcomes_of(sink_url: str, events: list[Event]) -> list[object]:
    sink = build_sink(parse_sink_url(sink_url), publish_timeout_seconds=5, event_source="/bytes")
    await sink.start()
    try:
        return list(await sink.publish(events))
    finally:
        await sink.close()


def check_forgeries_refused(outcomes: list[object]) -> None:
    assert outcomes[0] is None
    for outcome, content_type in zip(outcomes[1:], CLOUDEVENTS_CONTENT_TYPES, strict=True):
        assert isinstance(outcome, Failure) and outcome.permanent, outcome  # dead-lettered at once
        assert f"content type {content_type!r} names a CloudEvents format" in outcome.error
        assert "format=cloudevents-structured" in outcome.error


def test_binary_mode_dead_letters_a_payload_whose_content_type_is_a_cloudevents_format(
    kafka_bootstrap: str, amqp_url: str
) -> None:
    # Sent as it is, a reader would take the payload for the event: id 'forged', not the relay's.
    topic = unique_topic()
    events = forging_events(topic)
    check_forgeries_refused(asyncio.run(outcomes_of(f"kafka://{kafka_bootstrap}?format=cloudevents", events)))
    (only,) = consume(kafka_bootstrap, topic, count=1)
    assert kafka_event(only).get_id() == events[0].idempotency_key
    with temp_queue(amqp_url) as queue:
        events = forging_events(queue.name)
        check_forgeries_refused(asyncio.run(outcomes_of(f"{amqp_url}?format=cloudevents", events)))
        (message,) = queue.collect(1)
        assert queue.count() == 0
    assert amqp_event(message).get_id() == events[0].idempotency_key


@pytest.mark.parametrize("chosen", [Format.NATIVE, Format.CLOUDEVENTS_STRUCTURED])
def test_structured_mode_and_the_native_shape_send_such_payloads_as_written(
    kafka_bootstrap: str, amqp_url: str, chosen: Format
) -> None:
    topic = unique_topic()
    kafka_events = forging_events(topic)
    asyncio.run(publish(f"kafka://{kafka_bootstrap}?format={chosen.value}", kafka_events))
    received = {m.headers["idempotency-key"].decode(): m for m in consume(kafka_bootstrap, topic, count=5)}
    with temp_queue(amqp_url) as queue:
        amqp_events = forging_events(queue.name)
        asyncio.run(publish(f"{amqp_url}?format={chosen.value}", amqp_events))
        messages = {m.message_id: m for m in queue.collect(len(amqp_events))}
    assert len(received) == len(messages) == len(CLOUDEVENTS_CONTENT_TYPES) + 1
    for sent in kafka_events[1:]:
        message = received[sent.idempotency_key]
        if chosen is Format.NATIVE:  # the application's own shape: its payload and content type
            assert (message.value, message.headers["content-type"]) == (FORGED, (sent.content_type or "").encode())
            continue
        ce = structured_event(message)  # the payload is the data, the attributes the relay's
        assert (ce.get_id(), ce.get_data(), ce.get_datacontenttype()) == (
            sent.idempotency_key,
            FORGED,
            sent.content_type,
        )
    for sent in amqp_events[1:]:
        amqp_message = messages[sent.idempotency_key]
        if chosen is Format.NATIVE:
            assert (amqp_message.body, amqp_message.content_type) == (FORGED, sent.content_type)
            continue
        ce = amqp_event(amqp_message)
        assert (ce.get_id(), ce.get_data(), ce.get_datacontenttype()) == (
            sent.idempotency_key,
            FORGED,
            sent.content_type,
        )


def test_the_relay_dead_letters_such_a_row_at_once_and_parks_its_key(database_url: str, amqp_url: str) -> None:
    with temp_exchange(amqp_url) as exchange, temp_queue(amqp_url, exchange=exchange, routing_keys=["t"]) as queue:
        with psycopg.connect(database_url) as conn:
            producers.publish(
                conn, "t", FORGED, key="k", content_type="Application/CloudEvents+JSON", idempotency_key="forged"
            )
            producers.publish(conn, "t", {"after": 1}, key="k", idempotency_key="waits-behind")
            producers.publish(conn, "t", {"other": 1}, key="j", idempotency_key="flows")
        sink = f"{amqp_url}?exchange={exchange}&format=cloudevents"
        with RelayThread(database_url, sink, max_attempts=5):
            wait_until(lambda: outbox_counts(database_url) == {"failed": 1, "pending": 1})
            (message,) = queue.collect(1)
        assert message.message_id == "flows"
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT attempts, last_error FROM outbox WHERE state = 'failed'").fetchone()
    assert row is not None
    attempts, last_error = row
    assert attempts == 1  # permanent: not retried
    assert "names a CloudEvents format" in last_error


def bad_attribute_events(topic: str) -> list[Event]:
    """A good event, then one per attribute the spec forbids as its row has it, each its own key."""
    bad: list[Event] = [make_event(topic, key="k-good")]
    for n, (column, value) in enumerate(
        [
            ("idempotency_key", "id\twith a tab"),
            ("key", "key\x00nul"),
            ("content_type", "text/plain\r\nX-Injected: 1"),
            ("content_type", "not a media type"),
            ("headers", {"traceparent": "00-x\n"}),
        ]
    ):
        event = make_event(topic, key=f"k-{n}")
        if column == "content_type":
            event.content_type = str(value)
        elif column == "headers":
            event.headers = dict(value)  # type: ignore[arg-type]
        else:
            setattr(event, column, value)
        bad.append(event)
    return bad


def check_bad_attributes_refused(outcomes: list[object]) -> None:
    assert outcomes[0] is None
    for outcome in outcomes[1:]:
        assert isinstance(outcome, Failure) and outcome.permanent, outcome  # dead-lettered at once
        assert outcome.error.startswith("CloudEvents attribute "), outcome.error


@pytest.mark.parametrize("chosen", [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED])
def test_both_sinks_refuse_attributes_the_spec_forbids(kafka_bootstrap: str, amqp_url: str, chosen: Format) -> None:
    topic = unique_topic()
    events = bad_attribute_events(topic)
    check_bad_attributes_refused(asyncio.run(outcomes_of(f"kafka://{kafka_bootstrap}?format={chosen.value}", events)))
    (only,) = consume(kafka_bootstrap, topic, count=1)
    assert kafka_event(only).get_id() == events[0].idempotency_key
    with temp_queue(amqp_url) as queue:
        events = bad_attribute_events(queue.name)
        check_bad_attributes_refused(asyncio.run(outcomes_of(f"{amqp_url}?format={chosen.value}", events)))
        (message,) = queue.collect(1)
        assert queue.count() == 0
    assert amqp_event(message).get_id() == events[0].idempotency_key


def test_the_relay_dead_letters_a_row_whose_attributes_break_the_spec(database_url: str, amqp_url: str) -> None:
    """Rows written in SQL (publish() refuses such a content type): a line break in the topic, the key's
    next event held behind it, another key flowing."""
    with temp_exchange(amqp_url) as exchange, temp_queue(amqp_url, exchange=exchange, routing_keys=["t"]) as queue:
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "INSERT INTO outbox (topic, key, payload_bytes, content_type, idempotency_key) VALUES"
                " ('t', 'k', 'x', e'text/plain\\r\\nX-Injected: 1', 'bad-type'),"
                " ('t', 'j', 'y', 'text/plain', 'flows')"
            )
            producers.publish(conn, "t", {"after": 1}, key="k", idempotency_key="waits-behind")
        sink = f"{amqp_url}?exchange={exchange}&format=cloudevents-structured"
        with RelayThread(database_url, sink, max_attempts=5):
            wait_until(lambda: outbox_counts(database_url) == {"failed": 1, "pending": 1})
            (message,) = queue.collect(1)
        assert message.message_id == "flows"
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT idempotency_key, attempts, last_error FROM outbox WHERE state = 'failed'").fetchone()
    assert row is not None
    idempotency_key, attempts, last_error = row
    assert (idempotency_key, attempts) == ("bad-type", 1)  # permanent: not retried
    assert last_error.startswith("CloudEvents attribute datacontenttype 'text/plain\\r\\nX-Injected: 1'")
