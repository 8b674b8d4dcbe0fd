"""The Kafka sink: publishes outbox events with confluent-kafka (librdkafka).

librdkafka does the network work on its own threads. This module adds two:
a poll thread that serves delivery reports, client errors and log lines, and
one produce thread that fills librdkafka's queue, so a full queue never blocks
the event loop and batches are enqueued strictly in the order ``publish`` was
called. Each batch waits on a single asyncio future that the last delivery
report resolves; there is no future per message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka import KafkaError, KafkaException

from relay.config import CONNECT_TIMEOUT_SECONDS, KafkaSinkConfig
from relay.errors import SinkError, SinkTimeout, SinkUnavailable
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.secrets import Scrubber, secrets_of_options
from relay.sinks.base import scrubbed
from relay.sinks.kafka.batch import Batch
from relay.sinks.kafka.client import Client
from relay.sinks.kafka.errors import classify, describe, error_of, is_unreachable
from relay.sinks.kafka.settings import producer_config

logger = logging.getLogger(__name__)

WAIT_MARGIN_SECONDS = 5.0
CHECK_TIMEOUT_SECONDS = 5.0
RECENT_ACK_SECONDS = 2.0
FLUSH_TIMEOUT_SECONDS = 10.0
QUEUE_FULL_BACKOFF_SECONDS = 0.005


def _nothing() -> None:
    """A no-op job: once it ran, every job submitted before it has finished."""


def _log_retire_failure(done: Future[None]) -> None:
    exc = done.exception()
    if exc is not None:
        logger.error("kafka: stopping the broken producer failed: %r", exc, extra={"action": "kafka_retire_failed"})


class KafkaSink:
    """Publishes events to Kafka with an idempotent, ``acks=all`` producer.

    Use from one asyncio event loop: ``await start()``, then ``publish`` batches
    (several may be in flight at once; they are enqueued in call order), then
    ``await close()``.
    """

    name = "kafka"
    #: Not yet: until the sink keeps a key's order across batches in flight, keys move one claim at a time.
    chains_keys = False

    def __init__(
        self,
        config: KafkaSinkConfig,
        *,
        publish_timeout_seconds: float,
        client_id: str = "outbox-relay",
        connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
    ) -> None:
        self._config = config
        self._publish_timeout_seconds = publish_timeout_seconds
        self._connect_timeout_seconds = connect_timeout_seconds
        self._settings = producer_config(config, publish_timeout_seconds=publish_timeout_seconds, client_id=client_id)
        self._redact = Scrubber(secrets_of_options(config.options))
        self._client: Client | None = None
        self._closed = False
        self._last_ack = -float("inf")
        # One thread, so batches reach librdkafka in the order publish() was called.
        self._producing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-produce")

    async def start(self) -> None:
        """Build the producer and check that a broker answers; raise ``SinkUnavailable`` if not."""
        if self._closed:
            raise SinkError("kafka sink is closed")
        if self._client is None:
            self._client = Client(self._settings, self._redact)
        try:
            await self._probe(self._client, self._connect_timeout_seconds)
        except SinkUnavailable:
            client, self._client = self._client, None
            await asyncio.to_thread(client.shutdown, 0)
            raise
        logger.info("kafka sink connected to %s", self._config.bootstrap_servers, extra={"action": "kafka_connected"})

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        """Publish ``events`` and return one outcome per event, in order."""
        if not events:
            return []
        client = self._usable_client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._publish_timeout_seconds + WAIT_MARGIN_SECONDS
        started = time.monotonic()
        batch = Batch(len(events), loop)
        client.add(batch)
        try:
            await loop.run_in_executor(
                self._producing,
                self._produce_all,
                client,
                batch,
                events,
                time.monotonic() + self._publish_timeout_seconds,
            )
            remaining = deadline - loop.time()
            if remaining > 0:
                await asyncio.wait([batch.future], timeout=remaining)
        finally:
            client.discard(batch)
            outcomes = batch.close()
        if batch.acked:
            self._last_ack = time.monotonic()
        elif batch.unreachable == len(events):
            first = outcomes[0]
            reason = self._redact(first.error if first is not None else "no acknowledgement")
            where = self._config.bootstrap_servers
            if batch.timed_out and client.unreachable_at < started:
                # Connected, but no acknowledgement in time: the broker may have
                # stored the batch, and each retry may store a copy.
                raise SinkTimeout(f"kafka at {where} did not acknowledge in time: {reason}")
            raise SinkUnavailable(f"kafka at {where} unreachable: {reason}")
        failed = len(events) - batch.acked
        if failed:
            logger.warning(
                "kafka: %d of %d events not acknowledged",
                failed,
                len(events),
                extra={"action": "kafka_publish_failed", "batch_size": len(events)},
            )
            if self._redact:
                outcomes = scrubbed(outcomes, self._redact)
        return outcomes

    async def check(self) -> None:
        """Raise ``SinkUnavailable`` unless a broker answers now (or acknowledged just now)."""
        client = self._client
        if client is None or self._closed:
            raise SinkUnavailable("kafka sink is not started")
        if time.monotonic() - self._last_ack < RECENT_ACK_SECONDS:
            return
        await self._probe(client, min(CHECK_TIMEOUT_SECONDS, self._connect_timeout_seconds))

    async def close(self) -> None:
        """Flush for a bounded time, then stop the producer. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            # Let a batch still being enqueued finish before the producer goes away.
            await asyncio.get_running_loop().run_in_executor(self._producing, _nothing)
            await asyncio.to_thread(client.shutdown, FLUSH_TIMEOUT_SECONDS)
        self._producing.shutdown(wait=False)
        logger.info("kafka sink closed", extra={"action": "kafka_closed"})

    def _usable_client(self) -> Client:
        if self._closed:
            raise SinkError("kafka sink is closed")
        client = self._client
        if client is None:
            raise SinkError("kafka sink is not started")
        if client.broken is None:
            return client
        # A fatal error poisons the producer (e.g. its idempotence state); start afresh.
        logger.warning("kafka: replacing the broken producer", extra={"action": "kafka_rebuild"})
        self._client = Client(self._settings, self._redact)
        # Queued behind any batch still being enqueued into the old producer.
        self._producing.submit(client.shutdown, 0).add_done_callback(_log_retire_failure)
        return self._client

    async def _probe(self, client: Client, timeout_seconds: float) -> None:
        try:
            await asyncio.to_thread(client.producer.list_topics, timeout=timeout_seconds)
        except KafkaException as exc:
            reason = self._redact(describe(error_of(exc)))
            where = self._config.bootstrap_servers
            raise SinkUnavailable(f"cannot reach kafka at {where} within {timeout_seconds:g}s: {reason}") from None

    @staticmethod
    def _produce_all(client: Client, batch: Batch, events: Sequence[Event], deadline: float) -> None:
        """Enqueue every event (runs on the produce thread)."""
        produce = client.producer.produce
        for index, event in enumerate(events):
            if client.broken is not None:
                return  # mark_broken already failed this batch
            # confluent-kafka encodes str keys and header values as UTF-8 itself, in C.
            headers = event.message_header_pairs()
            callback = functools.partial(client.on_delivery, batch, index)
            while True:
                try:
                    produce(event.topic, event.payload, event.key, on_delivery=callback, headers=headers)
                    break
                except BufferError:
                    if time.monotonic() < deadline:
                        # The poll thread drains the queue as acknowledgements arrive.
                        time.sleep(QUEUE_FULL_BACKOFF_SECONDS)
                        continue
                    failure = Failure("kafka: local producer queue stayed full")
                    batch.fail_unreported(failure, unreachable=True, start=index)
                    return
                except KafkaException as exc:
                    error = error_of(exc)
                    if error.fatal() or error.code() == KafkaError._FATAL:
                        client.mark_broken(describe(error))
                        return
                    failure = classify(error)
                    if failure.permanent:
                        batch.record(index, failure)
                        break
                    # Later events may share this one's key: they must not overtake it.
                    batch.fail_unreported(failure, unreachable=is_unreachable(error), start=index)
                    return
