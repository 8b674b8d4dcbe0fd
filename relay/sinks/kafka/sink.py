"""The Kafka sink: publishes outbox events with confluent-kafka (librdkafka).

librdkafka does the network work on its own threads. This module adds two:
a poll thread that serves delivery reports, client errors and log lines, and
one produce thread that fills librdkafka's queue, so a full queue never blocks
the event loop and batches are enqueued strictly in the order ``publish`` was
called. Each batch waits on a single asyncio future that the last delivery
report resolves; there is no future per message. A delivery report is one
call bound to its event's place in the batch (:meth:`Batch.delivered`); an
acknowledgement is handled there in one frame, a failure by the client.

A key's order holds with several of its events in flight (``chains_keys``):
the idempotent producer keeps each partition's messages in order, librdkafka
never expires a message (``message.timeout.ms=0``, so no gap opens in the
middle of a run), ``enable.gapless.guarantee`` turns any other gap into a
fatal error, and whatever a batch does not get acknowledged holds its key (see
:mod:`relay.sinks.keyorder`). When a publish deadline passes with messages
unacknowledged, or the producer fails for good, it is retired and a new one
takes over (see :mod:`.client`). docs/delivery.md has the rules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from relay.config import CONNECT_TIMEOUT_SECONDS, KafkaSinkConfig
from relay.errors import SinkError, SinkTimeout, SinkUnavailable
from relay.events import EMPTY_TOPIC, Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.secrets import Scrubber, secrets_of_options
from relay.sinks.base import scrubbed
from relay.sinks.formats import DEFAULT_EVENT_SOURCE, kafka_encoder, refusal_of
from relay.sinks.kafka.batch import Batch
from relay.sinks.kafka.client import Client
from relay.sinks.kafka.errors import MAX_ERROR_CHARS, classify, describe, error_of, is_fatal, is_unreachable
from relay.sinks.kafka.settings import producer_config

logger = logging.getLogger(__name__)

#: How long a publish may run past ``--publish-timeout`` (retiring the producer takes milliseconds).
WAIT_MARGIN_SECONDS = 5.0
CHECK_TIMEOUT_SECONDS = 5.0
RECENT_ACK_SECONDS = 2.0
FLUSH_TIMEOUT_SECONDS = 10.0
QUEUE_FULL_BACKOFF_SECONDS = 0.005
#: Keys whose last topic the sink remembers (see ``KafkaSink._admit``); it starts afresh when full.
TOPIC_MEMORY_KEYS = 100_000
#: How long ``close`` waits for each retired producer to finish closing.
RETIRE_WAIT_SECONDS = 5.0


def _nothing() -> None:
    """A no-op job: once it ran, every job submitted before it has finished."""


class KafkaSink:
    """Publishes events to Kafka with an idempotent, ``acks=all`` producer.

    Use from one asyncio event loop: ``await start()``, then ``publish`` batches
    (several may be in flight at once; they are enqueued in call order), then
    ``await close()``.
    """

    name = "kafka"
    #: A key's events stay in order across batches in flight: one idempotent
    #: producer at a time, no librdkafka-side expiry, holds for what fails.
    chains_keys = True

    def __init__(
        self,
        config: KafkaSinkConfig,
        *,
        publish_timeout_seconds: float,
        client_id: str = "outbox-relay",
        connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
        event_source: str = DEFAULT_EVENT_SOURCE,
    ) -> None:
        self._config = config
        # The message shape (config.format), chosen once: called per event on the produce thread.
        self._encode = kafka_encoder(config.format, event_source)
        self._format_refusal = refusal_of(config.format)
        self._publish_timeout_seconds = publish_timeout_seconds
        self._connect_timeout_seconds = connect_timeout_seconds
        self._settings = producer_config(config, publish_timeout_seconds=publish_timeout_seconds, client_id=client_id)
        self._redact = Scrubber(secrets_of_options(config.options))
        self._client: Client | None = None
        #: Each key's topic last handed over (produce thread only).
        self._topics: dict[str, str] = {}
        #: Producers retired and closing in the background.
        self._retired: list[Client] = []
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
        """Publish ``events`` and return one outcome per event, in order.

        With ``holds``, each event is admitted (in call order, on the produce
        thread) before it is handed to the producer, and answered ``HELD`` if its
        key is on hold; every event not acknowledged holds its key.
        """
        if not events:
            return []
        client = self._usable_client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._publish_timeout_seconds
        started = time.monotonic()
        batch = Batch(events, loop, holds, client.on_delivery)
        client.add(batch)
        try:
            await loop.run_in_executor(
                self._producing,
                self._produce_all,
                client,
                batch,
                events,
                holds,
                time.monotonic() + self._publish_timeout_seconds,
            )
            remaining = deadline - loop.time()
            if remaining > 0:
                await asyncio.wait([batch.future], timeout=remaining)
        finally:
            if not batch.finished:
                # librdkafka never gives up on a message (message.timeout.ms=0, so a
                # timed-out message cannot leave a gap in a key's run): the relay's
                # own deadline ends the producer's attempts, for every batch on it.
                self._retire(client, f"kafka: no acknowledgement within {self._publish_timeout_seconds:g}s")
            client.discard(batch)
            outcomes = batch.close()
        if batch.acked:
            self._last_ack = time.monotonic()
        elif batch.unreachable and batch.unreachable + batch.held == len(events):
            # Each failure held its key as it came; said once more before the raise.
            batch.hold_unacknowledged()
            first = next(o for o in outcomes if o is not None and not o.held)
            reason = self._redact(first.error)
            where = self._config.bootstrap_servers
            if batch.timed_out and client.unreachable_at < started:
                # Connected, but no acknowledgement in time: the broker may have
                # stored the batch, and each retry may store a copy.
                raise SinkTimeout(f"kafka at {where} did not acknowledge in time: {reason}")
            raise SinkUnavailable(f"kafka at {where} unreachable: {reason}")
        failed = len(events) - batch.acked - batch.held
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
        if self._client is None or self._closed:
            raise SinkUnavailable("kafka sink is not started")
        if time.monotonic() - self._last_ack < RECENT_ACK_SECONDS:
            return
        await self._probe(self._usable_client(), min(CHECK_TIMEOUT_SECONDS, self._connect_timeout_seconds))

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
        retired, self._retired = self._retired, []
        for old in retired:
            if not await asyncio.to_thread(old.wait_closed, RETIRE_WAIT_SECONDS):
                logger.warning("kafka: a retired producer is still closing", extra={"action": "kafka_retire_slow"})
        self._producing.shutdown(wait=False)
        logger.info("kafka sink closed", extra={"action": "kafka_closed"})

    def _retire(self, client: Client, reason: str) -> None:
        if client.retire(reason):
            logger.warning(
                "%s; unacknowledged events given back, a new producer takes over",
                reason,
                extra={"action": "kafka_producer_retired"},
            )

    def _usable_client(self) -> Client:
        if self._closed:
            raise SinkError("kafka sink is closed")
        client = self._client
        if client is None:
            raise SinkError("kafka sink is not started")
        if client.broken is None:
            return client
        # Retired (a deadline passed, a fatal error, its idempotence state lost): start
        # afresh. Its batches were answered and their keys held before it was marked.
        logger.info("kafka: building a new producer", extra={"action": "kafka_rebuild"})
        self._retired = [old for old in self._retired if not old.wait_closed(0)]
        self._retired.append(client)
        self._client = Client(self._settings, self._redact)
        return self._client

    async def _probe(self, client: Client, timeout_seconds: float) -> None:
        try:
            await asyncio.to_thread(client.producer.list_topics, timeout=timeout_seconds)
        except KafkaException as exc:
            reason = self._redact(describe(error_of(exc)))
            where = self._config.bootstrap_servers
            raise SinkUnavailable(f"cannot reach kafka at {where} within {timeout_seconds:g}s: {reason}") from None

    def _produce_all(
        self, client: Client, batch: Batch, events: Sequence[Event], holds: KeyHolds | None, deadline: float
    ) -> None:
        """Admit and enqueue every event, in order (runs on the produce thread).

        Every event runs this loop, so its checks are inline and each runs only
        where it can matter: the holds and the topic memory for a keyed event
        with holds, the topic's refusal once per topic, the headers' NULs
        scanned in place (:func:`_nul_safe` only for a header that has one).

        Kafka keeps order only within a partition: a chained event goes only
        to the topic of its key's last event handed to this sink (the same
        partition). A chained event for another topic, or whose predecessor
        this sink did not see (another route's, or forgotten), is held instead:
        the relay gives it back, and claims it again once its key settled.
        """
        produce = client.producer.produce
        lock = client.lock
        delivered = batch.delivered
        encode = self._encode
        format_refusal = self._format_refusal
        admit = holds.admit if holds is not None else None
        topics = self._topics
        sendable: set[str] = set()  # this call's topics that _refusal passed
        for index, event in enumerate(events):
            topic = event.topic
            # confluent-kafka encodes str keys and header values as UTF-8 itself, in C.
            value, headers = encode(event)
            refused = None
            for name, header in headers:
                if "\x00" in name or (isinstance(header, str) and "\x00" in header):
                    headers, refused = _nul_safe(headers)
                    break
            if refused is None and topic not in sendable:
                refused = _refusal(event)
                if refused is None:
                    sendable.add(topic)
            if refused is None and format_refusal is not None:
                refused = format_refusal(event)
            callback = partial(delivered, index)
            with lock:
                if client.broken is not None:
                    return  # retire() failed this batch
                key = event.key
                if admit is not None and key is not None:
                    if not admit(event):
                        batch.refuse(index)
                        continue
                    if event.chained and topics.get(key) != topic:
                        batch.turns.hold((index,))
                        batch.refuse(index)
                        continue
                    if len(topics) >= TOPIC_MEMORY_KEYS and key not in topics:
                        topics.clear()
                    topics[key] = topic
                if refused is not None:
                    # After the holds: an event behind a held one of its key waits for it, refusable or not.
                    batch.record(index, Failure(refused, permanent=True))
                    continue
                try:
                    produce(topic, value, key, on_delivery=callback, headers=headers)
                    continue
                except (BufferError, KafkaException, ValueError, TypeError) as exc:
                    error: KafkaError | None = _produce_error(exc)
            while error is QUEUE_FULL:
                if time.monotonic() >= deadline:
                    full = Failure("kafka: local producer queue stayed full")
                    batch.fail_unreported(full, unreachable=True, start=index)
                    return
                # The poll thread drains the queue as acknowledgements arrive.
                time.sleep(QUEUE_FULL_BACKOFF_SECONDS)
                with lock:
                    if client.broken is not None:
                        return
                    error = _produce(produce, event, value, headers, callback)
            if error is None:
                continue
            if is_fatal(error):
                reason = self._redact(describe(error))
                if client.retire(reason):
                    logger.error("kafka producer fatal error: %s", reason, extra={"action": "kafka_fatal"})
                return
            failure = classify(error)
            if failure.permanent or holds is not None:
                # Its key is held at once: its later events in this batch and the next are HELD.
                batch.record(index, failure, unreachable=is_unreachable(error))
                continue
            # Without holds, later events may share this one's key: they must not overtake it.
            batch.fail_unreported(failure, unreachable=is_unreachable(error), start=index)
            return
        client.send_now()


#: What :func:`_produce` returns when librdkafka's queue is full.
QUEUE_FULL = KafkaError(KafkaError._QUEUE_FULL)


def _produce(
    produce: Callable[..., None],
    event: Event,
    value: bytes,
    headers: list[tuple[str, str | bytes | None]],
    callback: Callable[[KafkaError | None, Any], None],
) -> KafkaError | None:
    """Enqueue one message; the error that refused it, if any."""
    try:
        produce(event.topic, value, event.key, on_delivery=callback, headers=headers)
    except (BufferError, KafkaException, ValueError, TypeError) as exc:
        return _produce_error(exc)
    return None


def _produce_error(exc: BufferError | KafkaException | ValueError | TypeError) -> KafkaError:
    """The error that a ``produce`` call refused with stands for."""
    if isinstance(exc, BufferError):
        return QUEUE_FULL
    if isinstance(exc, KafkaException):
        return error_of(exc)
    # The client refuses a value before sending it (a string it cannot pass to C):
    # no retry can change that, and raising here would stop the relay.
    return KafkaError(KafkaError._INVALID_ARG, f"the Kafka client refused the message: {exc}"[:MAX_ERROR_CHARS])


def _refusal(event: Event) -> str | None:
    """Why the Kafka client can never take ``event`` (None: it may).

    Plain SQL on MySQL can write a NUL into the topic; a topic name goes to
    librdkafka as a C string, and the client refuses it. A Debezium row can
    have no topic at all (see :data:`relay.events.EMPTY_TOPIC`)."""
    if not event.topic:
        return EMPTY_TOPIC
    if "\x00" in event.topic:
        return "topic contains a NUL character, which no Kafka topic name can hold"
    return None


def _nul_safe(
    headers: list[tuple[str, str | bytes | None]],
) -> tuple[list[tuple[str, str | bytes | None]], str | None]:
    """``headers`` as the Kafka client carries them whole, or why it cannot.

    Plain SQL on MySQL can write a NUL into a header (JSON ``\\u0000``), the
    key or the idempotency key. confluent-kafka passes a header's name, and a
    value given as ``str``, to librdkafka as C strings: both were cut at the
    NUL without a word. A value goes as UTF-8 bytes instead, which keep it; a
    name cannot, so such an event is refused."""
    for name, value in headers:
        if "\x00" in name or (isinstance(value, str) and "\x00" in value):
            break
    else:
        return headers, None
    for name, _ in headers:
        if "\x00" in name:
            return headers, (
                f"header name {name[:40]!r} contains a NUL character, which the Kafka client cannot send "
                "(it would cut the name there); rename the header"
            )
    return [
        (name, value.encode() if isinstance(value, str) and "\x00" in value else value) for name, value in headers
    ], None
