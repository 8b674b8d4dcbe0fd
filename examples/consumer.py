"""The demo's consumers: record every message the relay delivered, with its arrival time.

Each runs on its own thread and writes into :class:`examples.shop.Deliveries`.
Kafka is read from every partition without a consumer group (nothing to
rebalance, nothing committed); RabbitMQ through a temporary queue bound to
every routing key of the sink's exchange.

:class:`InboxConsumer` is the long-running kind behind ``python -m
examples.services consumer`` (compose's ``consumer``): a Kafka consumer group
whose every event goes through the ``consumers`` inbox into a table of its own,
so a redelivered event changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

import consumers
from examples.shop import TOPIC, Deliveries
from relay.config import AmqpSinkConfig, KafkaSinkConfig
from relay.errors import ConfigError

logger = logging.getLogger(__name__)

KAFKA_PARTITIONS = 3
BROKER_TIMEOUT_SECONDS = 15.0
POLL_SECONDS = 1.0
# Kafka's smallest allowed session: a stopped member's partitions move on
# sooner, and brokers that wait out half a session before settling a new
# group (Tansu does) hand out the partitions in seconds.
SESSION_TIMEOUT_MS = 6000

# No unique constraint on purpose: only the inbox keeps an event from being recorded twice.
_CREATE_PROCESSED = (
    "CREATE TABLE IF NOT EXISTS consumer_order_events ("
    " id bigserial PRIMARY KEY, idempotency_key text NOT NULL, order_id text NOT NULL,"
    " event_type text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now())"
)
_INSERT_PROCESSED = "INSERT INTO consumer_order_events (idempotency_key, order_id, event_type) VALUES (%s, %s, %s)"
# Serialises the CREATE TABLEs of consumers starting at once (compose --scale).
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('outbox-relay example consumer schema'))"


def kafka_settings(config: KafkaSinkConfig) -> dict[str, Any]:
    """librdkafka settings shared by every client of the demo: where, and the URL's own options."""
    return {"bootstrap.servers": config.bootstrap_servers, "log.connection.close": False, **config.options}


def ensure_topic(config: KafkaSinkConfig, topic: str, partitions: int = KAFKA_PARTITIONS) -> None:
    """Create ``topic`` unless it exists.

    Brokers without topic auto-creation need it before the relay publishes,
    or the relay dead-letters the events for an unknown topic.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient(kafka_settings(config))  # kept referenced: its futures fail once it is collected
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    for future in admin.create_topics([new]).values():
        try:
            future.result(timeout=BROKER_TIMEOUT_SECONDS)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


class Tap:
    """A consumer on a thread that records every message in ``deliveries``."""

    def __init__(self, deliveries: Deliveries) -> None:
        self.deliveries = deliveries
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._guarded, name=type(self).__name__, daemon=True)

    def __enter__(self) -> Tap:
        self._thread.start()
        if not self._ready.wait(BROKER_TIMEOUT_SECONDS):
            self._stop.set()  # no __exit__ follows a failed __enter__
            raise TimeoutError(f"the demo's consumer did not start in {BROKER_TIMEOUT_SECONDS:.0f}s")
        if self._error is not None:
            raise RuntimeError(f"the demo's consumer failed: {self._error}") from self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=BROKER_TIMEOUT_SECONDS)

    def _guarded(self) -> None:
        try:
            self._consume()
        except Exception as exc:  # noqa: BLE001 - reported by __enter__, or below once running
            self._error = exc
            if self._ready.is_set():
                logger.error("the demo's consumer stopped: %s", exc)
            self._ready.set()

    def _consume(self) -> None:
        raise NotImplementedError


class KafkaTap(Tap):
    """Reads the demo topic from every partition, without a consumer group."""

    def __init__(self, config: KafkaSinkConfig, deliveries: Deliveries, *, from_start: bool) -> None:
        super().__init__(deliveries)
        self.config = config
        # A fresh broker holds only this run; elsewhere start at the end, past older runs.
        self.from_start = from_start

    def _consume(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        common = kafka_settings(self.config)
        ensure_topic(self.config, TOPIC)
        consumer = Consumer(
            {
                **common,
                "group.id": f"outbox-demo-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                # The default lets a fetch idle for 500 ms, which would hide the relay's latency.
                "fetch.wait.max.ms": 10,
            }
        )
        try:
            metadata = consumer.list_topics(TOPIC, timeout=BROKER_TIMEOUT_SECONDS)
            assignment = []
            for partition in metadata.topics[TOPIC].partitions:
                tp = TopicPartition(TOPIC, partition)
                if self.from_start:
                    tp.offset = OFFSET_BEGINNING
                else:
                    tp.offset = consumer.get_watermark_offsets(tp, timeout=BROKER_TIMEOUT_SECONDS)[1]
                assignment.append(tp)
            consumer.assign(assignment)
            self._ready.set()
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error() is not None:
                    logger.warning("consumer: %s", message.error())
                    continue
                headers = dict(message.headers() or [])
                key = headers.get("idempotency-key")
                if isinstance(key, bytes):
                    key = key.decode(errors="replace")
                self.deliveries.add(key, message.value())
        finally:
            consumer.close()


class RabbitTap(Tap):
    """A temporary queue bound to every routing key of the sink's exchange."""

    def __init__(self, config: AmqpSinkConfig, deliveries: Deliveries) -> None:
        super().__init__(deliveries)
        if not config.exchange:
            raise ConfigError("the demo needs a named exchange: add ?exchange=NAME to RELAY_SINK")
        self.config = config

    def _consume(self) -> None:
        import pika
        import pika.adapters.blocking_connection
        import pika.spec
        from pika.exchange_type import ExchangeType

        def on_message(
            channel: pika.adapters.blocking_connection.BlockingChannel,
            method: pika.spec.Basic.Deliver,
            properties: pika.spec.BasicProperties,
            body: bytes,
        ) -> None:
            key = (properties.headers or {}).get("idempotency-key")
            self.deliveries.add(str(key) if key is not None else None, body)

        connection = pika.BlockingConnection(pika.URLParameters(self.config.url))
        try:
            channel = connection.channel()
            channel.exchange_declare(self.config.exchange, exchange_type=ExchangeType("topic"), durable=True)
            queue = channel.queue_declare("", exclusive=True).method.queue
            assert queue is not None  # the broker names the queue
            channel.queue_bind(queue, self.config.exchange, routing_key="#")
            channel.basic_consume(queue, on_message, auto_ack=True)
            self._ready.set()
            while not self._stop.is_set():
                connection.sleep(0.2)  # serves the consumer meanwhile
        finally:
            connection.close()


class InboxConsumer:
    """Reads ``topic`` in consumer group ``group``; records each event once in ``consumer_order_events``.

    An offset is stored only after its event's transaction committed (and
    committed to Kafka in the background), so a crash or a rebalance
    redelivers; the inbox turns each redelivery into a logged no-op.
    """

    def __init__(
        self,
        config: KafkaSinkConfig,
        database_url: str,
        *,
        topic: str,
        group: str,
        inbox_table: str = consumers.DEFAULT_INBOX_TABLE,
    ) -> None:
        self.config = config
        self.database_url = database_url
        self.topic = topic
        self.group = group
        self.inbox_table = inbox_table
        self.processed = 0
        self.duplicates = 0
        self.unreadable = 0

    def prepare(self) -> None:
        """Create the inbox, the consumer's own table and the topic, where missing."""
        with psycopg.connect(self.database_url) as conn, conn.transaction():
            conn.execute(_SCHEMA_LOCK)
            consumers.create_inbox(conn, self.inbox_table)
            conn.execute(_CREATE_PROCESSED)
        ensure_topic(self.config, self.topic)

    def run(self, stop: threading.Event, on_poll: Callable[[], object] = lambda: None) -> None:
        """Consume until ``stop`` is set, calling ``on_poll`` before every poll (at least once a second).

        A database error or a fatal Kafka error ends the run by raising; the
        offsets of the events processed so far are committed on the way out.
        """
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer(
            {
                "group.id": self.group,
                # A new group starts at the oldest event, not at the next one.
                "auto.offset.reset": "earliest",
                "enable.auto.offset.store": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "logger": logger,
                **kafka_settings(self.config),  # the URL's options win
            }
        )
        try:
            consumer.subscribe([self.topic])
            with psycopg.connect(self.database_url) as conn:
                while not stop.is_set():
                    on_poll()
                    message = consumer.poll(POLL_SECONDS)
                    if message is None:
                        continue
                    error = message.error()
                    if error is not None:
                        if error.fatal():
                            raise KafkaException(error)
                        logger.warning("kafka: %s", error, extra={"action": "consumer_kafka_error"})
                        continue
                    self._handle(conn, message)
                    consumer.store_offsets(message)
        finally:
            consumer.close()

    def _handle(self, conn: psycopg.Connection[Any], message: Any) -> None:
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        try:
            key = consumers.idempotency_key_from_kafka(message)
            event = json.loads(message.value() or b"")
            order_id, event_type = str(event["order_id"]), str(event["type"])
        except (ValueError, KeyError, TypeError) as exc:
            # Retrying cannot make it readable, and stopping would block the partition for good.
            self.unreadable += 1
            logger.warning(
                "skipped an unreadable message at %s: %s", where, exc, extra={"action": "consumer_unreadable"}
            )
            return

        def record(c: psycopg.Connection[Any]) -> None:
            c.execute(_INSERT_PROCESSED, [key, order_id, event_type])

        context = {"idempotency_key": key, "order_id": order_id, "event_type": event_type, "at": where}
        if consumers.process_once(conn, key, record, topic=message.topic(), table=self.inbox_table):
            self.processed += 1
            logger.info("processed %s of %s", event_type, order_id, extra={"action": "consumer_processed", **context})
        else:
            self.duplicates += 1
            logger.info(
                "skipped %s of %s: processed before",
                event_type,
                order_id,
                extra={"action": "consumer_duplicate", **context},
            )
