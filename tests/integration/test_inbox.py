"""consumers: an event delivered many times is processed once (the inbox pattern)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import psycopg
import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka._types import HeadersType
from psycopg.rows import dict_row

import consumers
import producers
from devservers import FIRST_OFFSET
from relay.errors import ConfigError
from tests.integration.kafka_support import unique_topic
from tests.integration.rabbit_support import temp_queue
from tests.relay_support import RelayThread, outbox_counts, wait_until

READ_TIMEOUT_SECONDS = 20.0


class _QuietLog:
    def log(self, level: int, msg: str, *args: object) -> None:
        """Drop librdkafka's connection chatter."""


def prepare(url: str, table: str = "inbox") -> None:
    """The inbox plus a ``side_effects`` table the handlers write to."""
    with psycopg.connect(url) as conn:
        consumers.create_inbox(conn, table)
        conn.execute("CREATE TABLE IF NOT EXISTS side_effects (id serial PRIMARY KEY, note text NOT NULL)")
        conn.commit()


def record(note: str) -> Any:
    """A handler whose side effect is one ``side_effects`` row."""

    def handler(conn: psycopg.Connection[Any]) -> None:
        conn.execute("INSERT INTO side_effects (note) VALUES (%s)", [note])

    return handler


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def side_effects(url: str) -> list[str]:
    return [row[0] for row in rows(url, "SELECT note FROM side_effects ORDER BY id")]


def inbox_keys(url: str, table: str = "inbox") -> list[str]:
    return [row[0] for row in rows(url, f"SELECT idempotency_key FROM {table} ORDER BY idempotency_key")]


def read_topic_from_beginning(bootstrap: str, topic: str) -> Message[Any, Any]:
    """The first message on ``topic``, read by a brand-new consumer (as after a rebalance or restart)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"inbox-test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "logger": _QuietLog(),
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        consumer.assign([TopicPartition(topic, p, FIRST_OFFSET) for p in metadata.topics[topic].partitions])
        deadline = time.monotonic() + READ_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None and not message.error():
                return message
        raise AssertionError(f"nothing arrived on {topic} within {READ_TIMEOUT_SECONDS}s")
    finally:
        consumer.close()


def test_kafka_event_delivered_three_times_has_one_side_effect(database_url: str, kafka_bootstrap: str) -> None:
    prepare(database_url)
    topic = unique_topic()
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, topic, {"order": 7}, key="order-7", idempotency_key="order-7-paid")
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}"):
        wait_until(lambda: not outbox_counts(database_url))

    results = []
    with psycopg.connect(database_url) as conn:
        for _ in range(3):
            message = read_topic_from_beginning(kafka_bootstrap, topic)
            key = consumers.idempotency_key_from_kafka(message)
            note = json.dumps(json.loads(message.value() or b""))
            results.append(consumers.process_once(conn, key, record(note), topic=message.topic()))

    assert results == [True, False, False]
    assert side_effects(database_url) == ['{"order": 7}']
    assert rows(database_url, "SELECT idempotency_key, topic FROM inbox") == [("order-7-paid", topic)]


def test_rabbitmq_event_redelivered_three_times_has_one_side_effect(database_url: str, amqp_url: str) -> None:
    prepare(database_url)
    with temp_queue(amqp_url) as queue:
        with psycopg.connect(database_url) as conn:
            producers.publish(conn, queue.name, {"order": 8}, idempotency_key="order-8-paid")
        with RelayThread(database_url, amqp_url):
            wait_until(lambda: not outbox_counts(database_url))

        results, redelivered = [], []
        with psycopg.connect(database_url) as conn:
            for attempt in range(3):
                method, properties = None, None
                deadline = time.monotonic() + READ_TIMEOUT_SECONDS
                while method is None and time.monotonic() < deadline:
                    method, properties, _body = queue.channel.basic_get(queue.name, auto_ack=False)
                assert method is not None and properties is not None and method.delivery_tag is not None
                redelivered.append(method.redelivered)
                key = consumers.idempotency_key_from_amqp(properties)
                results.append(consumers.process_once(conn, key, record(key), topic=method.routing_key))
                if attempt < 2:
                    # As if the consumer died before acking: the broker delivers it again.
                    queue.channel.basic_nack(method.delivery_tag, requeue=True)
                else:
                    queue.channel.basic_ack(method.delivery_tag)
        assert queue.count() == 0

    assert redelivered == [False, True, True]
    assert results == [True, False, False]
    assert side_effects(database_url) == ["order-8-paid"]


def test_handler_failure_records_nothing_so_the_redelivery_is_processed(database_url: str) -> None:
    prepare(database_url)

    def fails(conn: psycopg.Connection[Any]) -> None:
        record("half-done")(conn)
        raise RuntimeError("downstream failed")

    with psycopg.connect(database_url) as conn:
        with pytest.raises(RuntimeError, match="downstream failed"):
            consumers.process_once(conn, "k-1", fails)
        assert inbox_keys(database_url) == [] and side_effects(database_url) == []
        assert consumers.process_once(conn, "k-1", record("done")) is True
        assert consumers.process_once(conn, "k-1", record("again")) is False
    assert inbox_keys(database_url) == ["k-1"]
    assert side_effects(database_url) == ["done"]


def _lock_waiters(url: str) -> int:
    [(count,)] = rows(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    return int(count)


@pytest.mark.parametrize("first_fails", [False, True], ids=["first-commits", "first-rolls-back"])
def test_concurrent_duplicate_waits_for_the_first_then_skips_or_takes_over(
    database_url: str, first_fails: bool
) -> None:
    prepare(database_url)
    inside, release = threading.Event(), threading.Event()

    def slow(conn: psycopg.Connection[Any]) -> None:
        record("first")(conn)
        inside.set()
        assert release.wait(20)
        if first_fails:
            raise RuntimeError("first delivery failed")

    def deliver(handler: Any) -> bool:
        with psycopg.connect(database_url) as conn:
            return consumers.process_once(conn, "same-key", handler)

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(deliver, slow)
        assert inside.wait(20)
        second = pool.submit(deliver, record("second"))
        # The second blocks on the inbox's unique index while the first is open.
        wait_until(lambda: _lock_waiters(database_url) == 1, timeout=20)
        assert not second.done()
        release.set()
        if first_fails:
            with pytest.raises(RuntimeError, match="first delivery failed"):
                first.result(timeout=20)
        else:
            assert first.result(timeout=20) is True
        assert second.result(timeout=20) is first_fails, "after a rollback the second takes over"

    assert side_effects(database_url) == (["second"] if first_fails else ["first"])
    assert inbox_keys(database_url) == ["same-key"]


def test_a_connection_inside_a_transaction_is_refused_before_anything_is_written(database_url: str) -> None:
    """True means committed: joined to the caller's transaction, the commit would come after the return."""
    prepare(database_url)
    ran: list[str] = []
    with psycopg.connect(database_url) as conn:
        with conn.transaction(force_rollback=True), pytest.raises(consumers.TransactionAlreadyOpen):
            consumers.process_once(conn, "k", lambda c: ran.append("in a transaction block"))
        conn.execute("SELECT 1")  # an implicit BEGIN, as psycopg opens one on a connection without autocommit
        with pytest.raises(consumers.TransactionAlreadyOpen):
            consumers.process_once(conn, "k", lambda c: ran.append("after an implicit BEGIN"))
        conn.rollback()
        assert consumers.process_once(conn, "k", record("kept")) is True
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        conn.transaction(),
        pytest.raises(consumers.TransactionAlreadyOpen),
    ):
        consumers.process_once(conn, "k2", lambda c: ran.append("autocommit, in a transaction block"))

    async def inside() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            await aconn.execute("SELECT 1")

            async def handler(c: psycopg.AsyncConnection[Any]) -> None:
                ran.append("async")

            with pytest.raises(consumers.TransactionAlreadyOpen):
                await consumers.aprocess_once(aconn, "k3", handler)

    asyncio.run(inside())
    assert ran == [] and side_effects(database_url) == ["kept"] and inbox_keys(database_url) == ["k"]


def test_pipeline_mode_and_other_row_factories(database_url: str) -> None:
    """In pipeline mode rowcount is -1 until a sync: a new key must still run the handler."""
    prepare(database_url)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        with conn.pipeline():
            assert consumers.process_once(conn, "p-1", record("in a pipeline")) is True
            assert consumers.process_once(conn, "p-1", record("a duplicate")) is False
        assert consumers.process_once(conn, "p-2", record("dict rows")) is True

    async def apipeline() -> list[bool]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:

            async def handler(c: psycopg.AsyncConnection[Any]) -> None:
                await c.execute("INSERT INTO side_effects (note) VALUES ('async pipeline')")

            async with aconn.pipeline():
                return [await consumers.aprocess_once(aconn, key, handler) for key in ("p-3", "p-3")]

    assert asyncio.run(apipeline()) == [True, False]
    assert side_effects(database_url) == ["in a pipeline", "dict rows", "async pipeline"]
    assert inbox_keys(database_url) == ["p-1", "p-2", "p-3"]


def test_aprocess_once(database_url: str) -> None:
    async def main() -> list[bool]:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await consumers.acreate_inbox(conn, "app_inbox")
            await conn.execute("CREATE TABLE side_effects (id serial PRIMARY KEY, note text NOT NULL)")
            await conn.commit()

            async def handler(c: psycopg.AsyncConnection[Any]) -> None:
                await c.execute("INSERT INTO side_effects (note) VALUES ('async')")

            async def fails(c: psycopg.AsyncConnection[Any]) -> None:
                await handler(c)
                raise RuntimeError("boom")

            with pytest.raises(RuntimeError, match="boom"):
                await consumers.aprocess_once(conn, "a-1", fails, table="app_inbox")
            return [await consumers.aprocess_once(conn, "a-1", handler, table="app_inbox") for _ in range(3)]

    assert asyncio.run(main()) == [True, False, False]
    assert side_effects(database_url) == ["async"]
    assert inbox_keys(database_url, "app_inbox") == ["a-1"]


def test_schema_qualified_inbox_and_invalid_names(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE SCHEMA app")
        conn.commit()
        consumers.create_inbox(conn, "app.inbox")
        consumers.create_inbox(conn, "app.inbox")  # idempotent
        conn.execute("CREATE TABLE side_effects (id serial PRIMARY KEY, note text NOT NULL)")
        conn.commit()
        assert consumers.process_once(conn, "k", record("x"), table="app.inbox", topic="t") is True
        with pytest.raises(ConfigError, match="invalid table name"):
            consumers.create_inbox(conn, 'inbox"; DROP TABLE side_effects; --')
        with pytest.raises(ConfigError, match="invalid table name"):
            consumers.process_once(conn, "k", record("x"), table="bad name")
        with pytest.raises(ValueError, match="non-empty"):
            consumers.process_once(conn, "", record("x"))
    assert rows(database_url, "SELECT idempotency_key, topic FROM app.inbox") == [("k", "t")]
    assert side_effects(database_url) == ["x"]


def test_idempotency_key_helpers() -> None:
    from_kafka = consumers.idempotency_key_from_kafka
    assert from_kafka(Message(headers=[("trace", b"t"), ("idempotency-key", b"k-1")])) == "k-1"
    assert from_kafka(Message(headers={"idempotency-key": "k-2"})) == "k-2"
    missing: list[HeadersType | None] = [None, [("trace", b"t")], [("idempotency-key", b"")]]
    for headers in missing:
        with pytest.raises(ValueError, match="no 'idempotency-key' header"):
            from_kafka(Message(headers=headers))

    from_amqp = consumers.idempotency_key_from_amqp
    assert from_amqp(pika.BasicProperties(message_id="m-1", headers={"idempotency-key": "other"})) == "m-1"
    assert from_amqp(pika.BasicProperties(headers={"idempotency-key": b"h-1"})) == "h-1"
    with pytest.raises(ValueError, match="neither a message_id nor"):
        from_amqp(pika.BasicProperties())


def test_a_kafka_message_with_two_different_idempotency_keys_is_refused() -> None:
    """Which of two keys is the event's cannot be told: taking the first would skip the event as a
    duplicate of whichever event that key belongs to (and a consumer taking the last would not)."""
    from_kafka = consumers.idempotency_key_from_kafka
    conflicting: list[HeadersType] = [
        [("idempotency-key", b"k-1"), ("idempotency-key", b"k-2")],
        [("idempotency-key", b"k-1"), ("trace", b"t"), ("idempotency-key", "k-2")],
    ]
    for headers in conflicting:
        with pytest.raises(ValueError, match="more than one 'idempotency-key'"):
            from_kafka(Message(headers=headers))
    # The same key twice, or beside an empty copy, is still that key.
    assert from_kafka(Message(headers=[("idempotency-key", b"k-1"), ("idempotency-key", "k-1")])) == "k-1"
    assert from_kafka(Message(headers=[("idempotency-key", b""), ("idempotency-key", b"k-1")])) == "k-1"


class _RacedConnection(psycopg.Connection[Any]):
    """Another thread's statement opens a transaction just after ``process_once`` found the
    connection idle (psycopg connections may be shared between threads)."""

    raced = False

    def transaction(self, *args: Any, **kwargs: Any) -> Any:
        if not self.raced:
            self.raced = True
            other = threading.Thread(target=self.execute, args=["INSERT INTO side_effects (note) VALUES ('other')"])
            other.start()
            other.join()
        return super().transaction(*args, **kwargs)


def test_a_transaction_another_thread_opens_after_the_idle_check_is_refused_too(database_url: str) -> None:
    """Joined to that transaction as a savepoint, True would come before the commit, and the other
    thread's rollback would take the key and the handler's writes with it."""
    prepare(database_url)
    with _RacedConnection.connect(database_url) as conn:
        with pytest.raises(consumers.TransactionAlreadyOpen):
            consumers.process_once(conn, "k-1", record("in the other thread's transaction"))
        conn.rollback()  # what the other thread does with its own transaction
        assert inbox_keys(database_url) == [] and side_effects(database_url) == []
        assert consumers.process_once(conn, "k-1", record("done")) is True
    assert inbox_keys(database_url) == ["k-1"] and side_effects(database_url) == ["done"]


def test_two_threads_sharing_a_connection_never_lose_a_key_reported_committed(database_url: str) -> None:
    """The second call must be refused without a statement: joined to the first's transaction as a
    savepoint it returned True before any commit, and the first's rollback undid its key and writes."""
    prepare(database_url)
    reported: list[str] = []

    def fails(conn: psycopg.Connection[Any]) -> None:
        record("rolled back")(conn)
        time.sleep(0.002)
        raise RuntimeError("first delivery failed")

    def deliver(conn: psycopg.Connection[Any], start: threading.Barrier, key: str, handler: Any) -> None:
        start.wait()
        with contextlib.suppress(Exception):  # anything but True is allowed; True must mean committed
            if consumers.process_once(conn, key, handler):
                reported.append(key)

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, to hit the moment between the check and BEGIN
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            for attempt in range(300):
                start = threading.Barrier(2)
                threads = [
                    threading.Thread(target=deliver, args=(conn, start, f"a-{attempt}", fails)),
                    threading.Thread(target=deliver, args=(conn, start, f"b-{attempt}", record(f"b-{attempt}"))),
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(20)
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
    finally:
        sys.setswitchinterval(switch_interval)
    assert reported, "no call got through"
    assert sorted(reported) == inbox_keys(database_url)
    assert sorted(reported) == sorted(side_effects(database_url))
