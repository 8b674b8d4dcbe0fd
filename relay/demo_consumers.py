"""The demo's consumers: record every message the relay delivered, with its arrival time.

Each runs on its own thread and writes into :class:`relay.demo_shop.Deliveries`.
Kafka is read from every partition without a consumer group (nothing to
rebalance, nothing committed); RabbitMQ through a temporary queue bound to
every routing key of the sink's exchange.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from relay.config import AmqpSinkConfig, KafkaSinkConfig
from relay.demo_shop import TOPIC, Deliveries
from relay.errors import ConfigError

logger = logging.getLogger(__name__)

KAFKA_PARTITIONS = 3
BROKER_TIMEOUT_SECONDS = 15.0


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
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        common: dict[str, Any] = {
            "bootstrap.servers": self.config.bootstrap_servers,
            "log.connection.close": False,
            **self.config.options,
        }
        # Brokers without topic auto-creation need the topic before the relay publishes.
        new = NewTopic(TOPIC, num_partitions=KAFKA_PARTITIONS, replication_factor=1)
        admin = AdminClient(common)  # kept referenced: its futures fail once it is collected
        for future in admin.create_topics([new]).values():
            try:
                future.result(timeout=BROKER_TIMEOUT_SECONDS)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
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
