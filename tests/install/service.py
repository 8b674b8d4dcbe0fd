"""A small service as a team writes one, run by the install test with a virtual environment's Python.

It is run as a file (``python service.py COMMAND ...``), never from the
repository, so ``producers``, ``consumers`` and the broker clients come from
the environment the package was installed into. Each command prints one JSON
object for the test to read.

- ``publish URL TOPIC N``: N events in N business transactions (one with a
  ``Decimal`` through ``json_default``); prints their idempotency keys.
- ``publish-mysql HOST PORT USER DATABASE TOPIC N``: the same on MySQL or MariaDB, through PyMySQL.
- ``inbox URL``: ``consumers.process_once`` records a key once, and skips it the second time.
- ``bind-rabbitmq AMQP_URL EXCHANGE QUEUE PATTERN``: the consumer's own queue, bound to the exchange.
- ``consume-kafka URL BOOTSTRAP TOPIC N`` / ``consume-rabbitmq URL AMQP_URL EXCHANGE QUEUE N``: N messages
  through the inbox, then the first one again (a redelivery); prints the keys processed and skipped
  (the RabbitMQ queue and exchange are deleted afterwards).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg

import consumers
import producers

RECEIVE_TIMEOUT_SECONDS = 60.0
_CREATE_RECEIVED = "CREATE TABLE IF NOT EXISTS received (idempotency_key text, body jsonb)"


def _where() -> dict[str, str]:
    """Where the imports came from: the environment's own site-packages, not the repository."""
    return {"producers": producers.__file__ or "", "consumers": consumers.__file__ or "", "prefix": sys.prefix}


def publish(url: str, topic: str, count: str) -> dict[str, Any]:
    keys = []
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, total numeric)")
        conn.commit()
        for n in range(int(count)):
            with conn.transaction():
                total = Decimal("9.90") + n
                conn.execute("INSERT INTO orders VALUES (%s, %s) ON CONFLICT (id) DO NOTHING", (n, total))
                payload = {"order_id": n, "total": total}
                keys.append(producers.publish(conn, topic, payload, key=f"order-{n}", json_default=str))
    return {"keys": keys, **_where()}


def publish_mysql(host: str, port: str, user: str, database: str, topic: str, count: str) -> dict[str, Any]:
    import pymysql

    conn = pymysql.connect(host=host, port=int(port), user=user, database=database, autocommit=False)
    try:
        keys = []
        for n in range(int(count)):
            payload = {"order_id": n, "total": Decimal("9.90") + n}
            keys.append(producers.publish(conn, topic, payload, key=f"order-{n}", json_default=str))
            conn.commit()
    finally:
        conn.close()
    return {"keys": keys, **_where()}


def _process(url: str, keys_and_bodies: list[tuple[str, bytes]], topic: str) -> dict[str, Any]:
    processed: list[str] = []
    skipped: list[str] = []
    with psycopg.connect(url) as conn:
        consumers.create_inbox(conn)
        conn.execute(_CREATE_RECEIVED)
        conn.commit()
        # The first message once more: a redelivery, which the inbox must skip.
        for key, body in [*keys_and_bodies, keys_and_bodies[0]]:

            def record(c: psycopg.Connection[Any], key: str = key, body: bytes = body) -> None:
                c.execute("INSERT INTO received VALUES (%s, %s::jsonb)", (key, body.decode()))

            (processed if consumers.process_once(conn, key, record, topic=topic) else skipped).append(key)
    return {"processed": processed, "skipped": skipped, **_where()}


def inbox(url: str) -> dict[str, Any]:
    return _process(url, [("inbox-check", b'{"n": 1}')], "inbox.check")


def _until(count: int, receive: Callable[[], tuple[str, bytes] | None]) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    deadline = time.monotonic() + RECEIVE_TIMEOUT_SECONDS
    while len(got) < count and time.monotonic() < deadline:
        message = receive()
        if message is not None:
            got.append(message)
    if len(got) < count:
        raise SystemExit(f"received {len(got)} of {count} messages in {RECEIVE_TIMEOUT_SECONDS:.0f} s")
    return got


def consume_kafka(url: str, bootstrap: str, topic: str, count: str) -> dict[str, Any]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "install-test",
            "auto.offset.reset": "earliest",
            # docs/kafka.md: a new group's first message in seconds on Tansu (and any broker).
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([topic])

    def receive() -> tuple[str, bytes] | None:
        message = consumer.poll(1.0)
        if message is None or message.error() is not None:
            return None
        return consumers.idempotency_key_from_kafka(message), message.value() or b""

    try:
        got = _until(int(count), receive)
    finally:
        consumer.close()
    return _process(url, got, topic)


def bind_rabbitmq(amqp_url: str, exchange: str, queue: str, pattern: str) -> dict[str, Any]:
    import pika
    from pika.exchange_type import ExchangeType

    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        # As the relay's declare=topic declares it: a durable topic exchange.
        channel.exchange_declare(exchange, exchange_type=ExchangeType("topic"), durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, routing_key=pattern)
    finally:
        connection.close()
    return {"bound": pattern}


def consume_rabbitmq(url: str, amqp_url: str, exchange: str, queue: str, count: str) -> dict[str, Any]:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()

        def receive() -> tuple[str, bytes] | None:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None or properties is None or body is None:
                time.sleep(0.1)
                return None
            return consumers.idempotency_key_from_amqp(properties), body.encode() if isinstance(body, str) else body

        got = _until(int(count), receive)
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
    finally:
        connection.close()
    return _process(url, got, queue)


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    "publish": publish,
    "publish-mysql": publish_mysql,
    "inbox": inbox,
    "bind-rabbitmq": bind_rabbitmq,
    "consume-kafka": consume_kafka,
    "consume-rabbitmq": consume_rabbitmq,
}

if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])))
