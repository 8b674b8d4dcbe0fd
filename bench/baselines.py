"""What the database and each broker can do without the relay: the denominators of every ratio.

- ``l_db``: the cheapest possible drain of the same rows, one statement per
  1,000 events (claim and settle in one), rows decoded by psycopg, no broker.
- ``l_kafka``: librdkafka with the relay's own producer settings, one delivery
  callback per message, like the relay.
- ``l_rmq``: pika with pipelined publisher confirms, persistent and mandatory,
  the same properties as the relay's sink.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import psycopg
from confluent_kafka import Producer
from pika import spec
from pika.adapters.asyncio_connection import AsyncioConnection

from bench import cpu, stats
from bench.services import DISTINCT_KEYS, payload_for
from relay.config import BATCH_SIZE, PIPELINE_DEPTH, PUBLISH_TIMEOUT_SECONDS, KafkaSinkConfig
from relay.events import IDEMPOTENCY_HEADER
from relay.sinks.kafka import producer_config

#: Fixed at 1,000, as issue 5 defines L_db; the relay's own batch size is a lever it may pull.
DB_BATCH = 1000
DRAIN_SQL = (
    f"DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT {DB_BATCH} FOR UPDATE SKIP LOCKED)"
    " RETURNING id, topic, key, payload, headers, idempotency_key"
)
KAFKA_POLL_EVERY = 1000
RABBIT_YIELD_EVERY = 250
#: Unconfirmed messages in flight at most: what the relay's batches in flight hold.
RABBIT_WINDOW = BATCH_SIZE * PIPELINE_DEPTH
RABBIT_TIMEOUT_SECONDS = 600.0


def l_db(database_url: str, events: int) -> dict[str, Any]:
    """Drain the outbox with the bare DELETE ... RETURNING loop; events per second."""
    drained = 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        before = cpu.snapshot()
        started = time.perf_counter()
        while True:
            rows = conn.execute(DRAIN_SQL).fetchall()
            if not rows:
                break
            drained += len(rows)
        elapsed = time.perf_counter() - started
        after = cpu.snapshot()
    return {
        "events": drained,
        "seconds": elapsed,
        "rate": drained / elapsed if elapsed else 0.0,
        "cpu": cpu.per_event(before, after, drained),
    }


def l_kafka(bootstrap: str, topic: str, events: int, *, keyed: bool = True) -> dict[str, Any]:
    """Produce ``events`` messages with the relay's settings and wait for every delivery report."""
    settings = producer_config(
        KafkaSinkConfig(bootstrap_servers=bootstrap),
        publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS,
        client_id="bench-baseline",
    )
    producer = Producer(settings)
    messages = [
        (payload_for(g), f"order-{g % DISTINCT_KEYS}".encode() if keyed else None) for g in range(1, events + 1)
    ]
    report = {"acked": 0, "failed": 0, "last": 0.0}

    def delivered(error: Any, _message: Any) -> None:
        report["failed" if error is not None else "acked"] += 1
        report["last"] = time.perf_counter()

    started = time.perf_counter()
    for index, (payload, key) in enumerate(messages):
        headers: list[tuple[str, str | bytes | None]] = [(IDEMPOTENCY_HEADER, str(uuid.uuid4()).encode())]
        while True:
            try:
                producer.produce(topic, payload, key, on_delivery=delivered, headers=headers)
                break
            except BufferError:
                producer.poll(0.005)
        if index % KAFKA_POLL_EVERY == 0:
            producer.poll(0)
    left = producer.flush(PUBLISH_TIMEOUT_SECONDS * 2)
    elapsed = report["last"] - started
    return {
        "events": events,
        "acked": report["acked"],
        "failed": report["failed"] + left,
        "seconds": elapsed,
        "rate": report["acked"] / elapsed if elapsed > 0 else 0.0,
    }


def l_latency(bootstrap: str, topic: str, rate: float, seconds: float, receiver: Any) -> dict[str, Any]:
    """The broker's own latency floor: raw produce at ``rate`` (open loop) to ack and to ``receiver``.

    ``receiver`` is a started ``KafkaReceiver`` with keys on ``topic``.
    """
    settings = producer_config(
        KafkaSinkConfig(bootstrap_servers=bootstrap),
        publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS,
        client_id="bench-latency",
    )
    producer = Producer(settings)
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}

    def on_delivery(key: str) -> Any:
        def delivered(error: Any, _message: Any) -> None:
            if error is None:
                acked[key] = time.monotonic()

        return delivered

    started = time.monotonic()
    for i in itertools.count():
        due = started + i / rate
        if due >= started + seconds:
            break
        delay = due - time.monotonic()
        if delay > 0:
            # Serve delivery reports while waiting, as the relay's poll thread would.
            producer.poll(delay)
        key = str(uuid.uuid4())
        sent[key] = time.monotonic()
        producer.produce(
            topic,
            payload_for(i),
            f"order-{i % DISTINCT_KEYS}".encode(),
            on_delivery=on_delivery(key),
            headers=[(IDEMPOTENCY_HEADER, key.encode())],
        )
        producer.poll(0)
    producer.flush(PUBLISH_TIMEOUT_SECONDS)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(key not in receiver.received_at for key in sent):
        time.sleep(0.05)
    warm = started + max(1.0, 0.1 * seconds)
    kept = [key for key, at in sent.items() if at >= warm]
    return {
        "rate": rate,
        "seconds": seconds,
        "to_ack": stats.latency_summary(acked[k] - sent[k] for k in kept if k in acked),
        "to_consume": stats.latency_summary(
            receiver.received_at[k] - sent[k] for k in kept if k in receiver.received_at
        ),
    }


def l_rmq(
    url: str,
    queue: str,
    events: int,
    *,
    window: int = RABBIT_WINDOW,
    payload: Callable[[int], bytes] = payload_for,
) -> dict[str, Any]:
    """Publish ``events`` persistent, mandatory messages with pipelined confirms; wait for every confirm.

    Message ``g`` (from 1) carries ``payload(g)``.
    """
    return asyncio.run(_l_rmq(url, queue, events, window, payload))


async def _l_rmq(url: str, queue: str, events: int, window: int, payload_of: Callable[[int], bytes]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[Any] = loop.create_future()
    all_confirmed: asyncio.Future[None] = loop.create_future()
    state = {"acked": 0, "nacked": 0, "returned": 0, "lowest": 1}
    unconfirmed: set[int] = set()
    window_open = asyncio.Event()

    def on_confirm(frame: Any) -> None:
        method = frame.method
        tags = range(state["lowest"], method.delivery_tag + 1) if method.multiple else (method.delivery_tag,)
        outcome = "acked" if isinstance(method, spec.Basic.Ack) else "nacked"
        for tag in tags:
            if tag in unconfirmed:
                unconfirmed.discard(tag)
                state[outcome] += 1
        if method.multiple:
            state["lowest"] = max(state["lowest"], method.delivery_tag + 1)
        window_open.set()
        if state["acked"] + state["nacked"] >= events and not all_confirmed.done():
            all_confirmed.set_result(None)

    def on_return(*_: Any) -> None:
        state["returned"] += 1

    def on_channel(channel: Any) -> None:
        channel.add_on_return_callback(on_return)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: opened.set_result(channel))

    def on_open(connection: Any) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_error(_connection: Any, error: Any) -> None:
        if not opened.done():
            opened.set_exception(RuntimeError(f"RabbitMQ connection failed: {error!r}"))

    connection = AsyncioConnection(
        pika.URLParameters(url), on_open_callback=on_open, on_open_error_callback=on_error, custom_ioloop=loop
    )
    channel = await opened
    payloads = [payload_of(g) for g in range(1, events + 1)]
    started = time.perf_counter()
    for index, payload in enumerate(payloads):
        if index and index % RABBIT_YIELD_EVERY == 0:
            await asyncio.sleep(0)
        if len(unconfirmed) >= window:
            # Refill in chunks, as the relay's batches do, not one message per confirm.
            while len(unconfirmed) > window // 2:
                window_open.clear()
                await window_open.wait()
        key = str(uuid.uuid4())
        properties = pika.BasicProperties(
            content_type="application/json",
            delivery_mode=2,
            message_id=key,
            headers={IDEMPOTENCY_HEADER: key},
        )
        channel.basic_publish("", queue, payload, properties, mandatory=True)
        unconfirmed.add(index + 1)  # delivery tags count from 1 on a new confirm-mode channel
    await asyncio.wait_for(all_confirmed, RABBIT_TIMEOUT_SECONDS)
    elapsed = time.perf_counter() - started
    closed: asyncio.Future[None] = loop.create_future()

    def on_close(*_: Any) -> None:
        if not closed.done():
            closed.set_result(None)

    connection.add_on_close_callback(on_close)
    connection.close()
    await asyncio.wait_for(closed, 10)
    return {
        "events": events,
        "acked": state["acked"],
        "failed": state["nacked"] + state["returned"],
        "seconds": elapsed,
        "rate": state["acked"] / elapsed if elapsed else 0.0,
    }
