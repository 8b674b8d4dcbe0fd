"""Bytes payloads end to end: PostgreSQL to Tansu Kafka and to RabbitMQ, read back exactly."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

import psycopg
import pytest
from confluent_kafka import Consumer, Message, TopicPartition

import producers
from devservers import FIRST_OFFSET
from tests.acceptance.cli import cli
from tests.integration.kafka_support import unique_topic
from tests.integration.rabbit_support import temp_queue
from tests.relay_support import RelayThread, outbox_counts, wait_until

#: Not UTF-8 (a lone continuation byte, an invalid two-byte sequence), with NUL and every other byte value.
NOT_UTF8 = b"\x80\xc3\x28" + bytes(range(256))


def publish_all(database_url: str, topic: str) -> None:
    """One event of each form, all of one key so that they arrive in this order."""
    with psycopg.connect(database_url) as conn:
        producers.publish(
            conn, topic, NOT_UTF8, key="k", content_type="application/x-protobuf", idempotency_key="pb",
            headers={"Content-Type": "text/plain", "trace": "t1"},  # the column wins over a row header
        )  # fmt: skip
        producers.publish(conn, topic, b"", key="k", idempotency_key="empty")  # application/octet-stream
        producers.publish(conn, topic, {"json": "é"}, key="k", idempotency_key="json", headers={"trace": "t2"})
        # Plain SQL, as docs/bytes.md shows it.
        conn.execute(
            "INSERT INTO outbox (topic, key, payload_bytes, content_type, idempotency_key)"
            " VALUES (%s, 'k', '\\x00ff'::bytea, 'application/x-avro', 'sql')",
            [topic],
        )


def test_bytes_reach_kafka_exactly_with_a_content_type_header(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    publish_all(database_url, topic)
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}"):
        wait_until(lambda: not outbox_counts(database_url))
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"bytes-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, FIRST_OFFSET) for p in partitions])
        messages: list[Message] = []
        while len(messages) < 4:
            message = consumer.poll(10)
            assert message is not None, f"only {len(messages)} messages arrived"
            assert message.error() is None, message.error()
            messages.append(message)
    finally:
        consumer.close()
    got = [(m.value(), m.headers()) for m in messages]
    assert got == [
        (NOT_UTF8, [("trace", b"t1"), ("idempotency-key", b"pb"), ("content-type", b"application/x-protobuf")]),
        # An empty value, not a null one (a tombstone).
        (b"", [("idempotency-key", b"empty"), ("content-type", b"application/octet-stream")]),
        # A JSON payload as always: no content-type header.
        ('{"json": "é"}'.encode(), [("trace", b"t2"), ("idempotency-key", b"json")]),
        (b"\x00\xff", [("idempotency-key", b"sql"), ("content-type", b"application/x-avro")]),
    ]


def test_bytes_reach_rabbitmq_exactly_with_their_content_type(database_url: str, amqp_url: str) -> None:
    with temp_queue(amqp_url) as q:
        publish_all(database_url, q.name)
        with RelayThread(database_url, amqp_url):
            wait_until(lambda: not outbox_counts(database_url))
            messages = q.collect(4)
    assert [(m.message_id, m.body, m.content_type) for m in messages] == [
        ("pb", NOT_UTF8, "application/x-protobuf"),
        ("empty", b"", "application/octet-stream"),
        ("json", '{"json": "é"}'.encode(), "application/json"),
        ("sql", b"\x00\xff", "application/x-avro"),
    ]
    # Headers travel as they are: RabbitMQ has the content type as a property of its own.
    assert messages[0].headers == {"Content-Type": "text/plain", "trace": "t1", "idempotency-key": "pb"}


def test_admin_commands_show_and_replay_a_bytes_event(database_url: str, amqp_url: str) -> None:
    with temp_queue(amqp_url) as q:
        with psycopg.connect(database_url) as conn:
            producers.publish(conn, q.name, NOT_UTF8, content_type="application/x-protobuf", idempotency_key="pb")
            event_id = conn.execute("SELECT id FROM outbox").fetchone()
        assert event_id is not None
        url = ["--database-url", database_url]

        shown = json.loads(cli("inspect", str(event_id[0]), "--json", *url).stdout)
        assert (shown["payload"], shown["content_type"]) == (None, "application/x-protobuf")
        assert base64.b64decode(shown["payload_bytes"]) == NOT_UTF8
        text = cli("inspect", str(event_id[0]), *url).stdout
        assert f"payload_bytes: \\x{NOT_UTF8.hex()}\n" in text

        with RelayThread(database_url, amqp_url, keep_sent=True):
            wait_until(lambda: outbox_counts(database_url) == {"sent": 1})
            result = cli("replay", "--all", *url)
            assert result.returncode == 0 and "replayed 1" in result.stdout, result
            wait_until(lambda: outbox_counts(database_url) == {"sent": 1} and q.count() == 2)
        messages = q.collect(2)
    assert [(m.body, m.content_type) for m in messages] == [(NOT_UTF8, "application/x-protobuf")] * 2


@pytest.mark.parametrize(
    ("payload", "content_type", "error"),
    [
        ({"a": 1}, "application/json", TypeError),  # content_type is for bytes
        (b"x", "", ValueError),
        (b"x", "c" * 256, ValueError),
    ],
)
def test_publish_refuses_a_content_type_it_cannot_keep(
    database_url: str, payload: object, content_type: str, error: type[Exception]
) -> None:
    with psycopg.connect(database_url) as conn, pytest.raises(error):
        producers.publish(conn, "t", payload, content_type=content_type)


def test_apublish_writes_bytes_too(database_url: str) -> None:
    async def write() -> list[tuple[object, ...]]:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await producers.apublish(conn, "t", bytearray(b"\x00\x01"), content_type="a/b", idempotency_key="a")
            await conn.commit()
            cur = await conn.execute("SELECT payload, payload_bytes, content_type FROM outbox")
            return await cur.fetchall()

    assert asyncio.run(write()) == [(None, b"\x00\x01", "a/b")]
