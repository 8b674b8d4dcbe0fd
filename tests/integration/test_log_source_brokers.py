"""The log source through real brokers: table rows and messages (publish(..., via="message")) look alike."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import producers
from relay.config import parse_sink_url
from relay.sinks import build_sink
from tests.integration.kafka_support import consume, unique_topic
from tests.integration.rabbit_support import temp_queue
from tests.log_support import caught_up, running, synchronous, until


def _write_both(url: str, topic: str) -> None:
    with psycopg.connect(url) as conn:
        producers.publish(conn, topic, {"b": [1, 2], "a": "é"}, key="k", headers={"h": "1"}, idempotency_key="row")
        producers.publish(conn, topic, {"b": [1, 2], "a": "é"}, key="k", headers={"h": "1"}, idempotency_key="msg",
                          via="message")  # fmt: skip
        producers.publish(conn, topic, b"\x00raw", key="k", content_type="application/x-raw", via="message")


async def _apublish_one(url: str, topic: str) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await producers.apublish(conn, topic, {"n": 4}, key="k", via="message")


def _table_empty(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return row is not None and row[0] == 0


@pytest.mark.parametrize("fmt", ["native", "cloudevents"])
@synchronous
async def test_kafka_rows_and_messages_alike(log_database: tuple[str, str], kafka_bootstrap: str, fmt: str) -> None:
    url, slot = log_database
    topic = unique_topic()
    _write_both(url, topic)
    await _apublish_one(url, topic)
    sink = build_sink(parse_sink_url(f"kafka://{kafka_bootstrap}?format={fmt}"), publish_timeout_seconds=10)
    done = caught_up(url, slot)
    async with running(url, slot, sink):
        await until(lambda: _table_empty(url) and done())
    got = await asyncio.to_thread(consume, kafka_bootstrap, topic, count=4)
    assert len(got) == 4
    row, message, raw, last = got
    assert row.key == message.key == b"k"
    assert row.value == message.value  # the same bytes from a jsonb column and from an envelope
    drop = {"idempotency-key", "ce_id", "ce_time"}
    assert {k: v for k, v in row.headers.items() if k not in drop} == {
        k: v for k, v in message.headers.items() if k not in drop
    }
    assert row.headers["idempotency-key"] == b"row" and message.headers["idempotency-key"] == b"msg"
    assert raw.value == b"\x00raw"
    assert b'"n": 4' in last.value or b'"n":4' in last.value


@synchronous
async def test_rabbitmq_delivers_messages(log_database: tuple[str, str], amqp_url: str) -> None:
    url, slot = log_database
    with temp_queue(amqp_url) as queue:
        with psycopg.connect(url) as conn:
            for n in range(3):
                producers.publish(conn, queue.name, {"n": n}, key="k", via="message" if n % 2 else "table")
        sink = build_sink(parse_sink_url(amqp_url), publish_timeout_seconds=10)
        async with running(url, slot, sink):
            bodies: list[bytes] = []

            def drained() -> bool:
                while (got := queue.channel.basic_get(queue.name, auto_ack=True))[0] is not None:
                    body: Any = got[2]
                    bodies.append(body if isinstance(body, bytes) else body.encode())
                return len(bodies) >= 3

            await until(drained)
    assert bodies == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
