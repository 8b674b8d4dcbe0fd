"""Consumers that timestamp what reaches the broker's far side.

Each runs on its own thread and keeps a receive log (``marks``: time and
count, at least once per fetched batch) for rates, and, when asked, the first
receive time of every idempotency key for latencies and loss checks.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from confluent_kafka import Consumer, TopicPartition

from devservers import FIRST_OFFSET
from relay.events import IDEMPOTENCY_HEADER

POLL_SECONDS = 0.05
RABBIT_POLL_SECONDS = 1  # pika takes whole seconds; messages still arrive as they come
KAFKA_FETCH_BATCH = 1000
#: The broker may hold a fetch this long for data. Shorter adds less latency, but Tansu
#: falls behind (and stops serving) when flooded with 1 ms fetches of small batches.
KAFKA_FETCH_WAIT_MS = 25
RABBIT_PREFETCH = 5000
MARK_EVERY_MESSAGES = 100


class Receiver(threading.Thread):
    """The common part: counting, marks, keys, waiting and stopping."""

    def __init__(self, name: str, *, keys: bool) -> None:
        super().__init__(name=name, daemon=True)
        self.keep_keys = keys
        self.count = 0
        self.marks: list[tuple[float, int]] = []
        #: idempotency key -> monotonic time it was first received.
        self.received_at: dict[str, float] = {}
        self.duplicates = 0
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Ask the thread to finish and wait for it."""
        self._stop_event.set()
        self.join(30)

    def wait_for(
        self, total: int, timeout: float, progress: Callable[[int], None] | None = None, every: float = 2.0
    ) -> bool:
        """Wait until ``total`` messages arrived; False on timeout. Calls ``progress`` now and then."""
        deadline = time.monotonic() + timeout
        next_report = time.monotonic() + every
        while self.count < total:
            if self.error is not None:
                raise RuntimeError(f"{self.name} failed: {self.error!r}") from self.error
            now = time.monotonic()
            if now > deadline:
                return False
            if progress is not None and now >= next_report:
                next_report = now + every
                progress(self.count)
            time.sleep(0.02)
        return True

    def _note_key(self, key: str | None, now: float) -> None:
        if key is None:
            return
        if key in self.received_at:
            self.duplicates += 1
        else:
            self.received_at[key] = now


class KafkaReceiver(Receiver):
    """Reads every partition of ``topic`` from the beginning, without a consumer group."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, keys: bool = False) -> None:
        super().__init__(f"kafka-receiver-{topic}", keys=keys)
        self._config = {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}.reader",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": KAFKA_FETCH_WAIT_MS,
            "fetch.min.bytes": 1,
        }
        self._partitions = [TopicPartition(topic, p, FIRST_OFFSET) for p in range(partitions)]

    def run(self) -> None:
        try:
            consumer = Consumer(self._config)
            try:
                consumer.assign(self._partitions)
                self.ready.set()
                self._loop(consumer)
            finally:
                consumer.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait_for in the main thread
            self.error = exc
            self.ready.set()

    def _loop(self, consumer: Consumer) -> None:
        while not self._stop_event.is_set():
            messages = consumer.consume(num_messages=KAFKA_FETCH_BATCH, timeout=POLL_SECONDS)
            if not messages:
                continue
            now = time.monotonic()
            good = 0
            for message in messages:
                if message.error() is not None:
                    continue
                good += 1
                if self.keep_keys:
                    self._note_key(_header(message.headers()), now)
            self.count += good
            self.marks.append((now, self.count))


def _header(headers: Any) -> str | None:
    for name, value in headers or ():
        if name == IDEMPOTENCY_HEADER and isinstance(value, bytes):
            return value.decode()
    return None


class RabbitReceiver(Receiver):
    """Consumes ``queue`` with automatic acknowledgement (the broker pushes as fast as it can)."""

    def __init__(self, url: str, queue: str, *, keys: bool = False) -> None:
        super().__init__(f"rabbit-receiver-{queue}", keys=keys)
        self._url = url
        self._queue = queue

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self._url))
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=RABBIT_PREFETCH)
                channel.basic_consume(self._queue, self._on_message, auto_ack=True)
                self.ready.set()
                while not self._stop_event.is_set():
                    connection.process_data_events(time_limit=RABBIT_POLL_SECONDS)
                    self.marks.append((time.monotonic(), self.count))
            finally:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    connection.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait_for in the main thread
            self.error = exc
            self.ready.set()

    def _on_message(
        self,
        channel: object,
        method: object,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self.count += 1
        if self.keep_keys or self.count % MARK_EVERY_MESSAGES == 0:
            now = time.monotonic()
            if self.keep_keys:
                self._note_key(properties.message_id, now)
            if self.count % MARK_EVERY_MESSAGES == 0:
                self.marks.append((now, self.count))
