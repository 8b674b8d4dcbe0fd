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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from relay.config import CONNECT_TIMEOUT_SECONDS, KafkaSinkConfig, is_secret_option
from relay.errors import ConfigError, SinkError, SinkUnavailable
from relay.events import Event, Failure, Outcome

logger = logging.getLogger(__name__)
librdkafka_logger = logging.getLogger(f"{__name__}.librdkafka")

POLL_INTERVAL_SECONDS = 0.05
LINGER_MS = 5
BATCH_NUM_MESSAGES = 10_000
QUEUE_BUFFERING_MAX_MESSAGES = 100_000
WAIT_MARGIN_SECONDS = 5.0
CHECK_TIMEOUT_SECONDS = 5.0
RECENT_ACK_SECONDS = 2.0
FLUSH_TIMEOUT_SECONDS = 10.0
QUEUE_FULL_BACKOFF_SECONDS = 0.005
CLIENT_ERROR_LOG_INTERVAL_SECONDS = 30.0
MAX_ERROR_CHARS = 200

_E = KafkaError

#: Errors that no retry can fix: the event is dead-lettered at once.
PERMANENT_ERRORS = frozenset(
    {
        _E.MSG_SIZE_TOO_LARGE,
        _E.INVALID_MSG_SIZE,
        _E.RECORD_LIST_TOO_LARGE,
        _E.INVALID_RECORD,
        _E.UNKNOWN_TOPIC_OR_PART,
        _E._UNKNOWN_TOPIC,
        _E._UNKNOWN_PARTITION,
        _E.TOPIC_AUTHORIZATION_FAILED,
        _E.TOPIC_EXCEPTION,
        _E.POLICY_VIOLATION,
        _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        _E._INVALID_ARG,
        _E._BAD_MSG,
    }
)

#: Errors that mean the cluster could not be reached (or would not let us in).
#: A batch that failed only with these raises ``SinkUnavailable``, so the relay
#: backs off without spending the events' attempts.
UNREACHABLE_ERRORS = frozenset(
    {
        _E._MSG_TIMED_OUT,
        _E._TIMED_OUT,
        _E._TIMED_OUT_QUEUE,
        _E._TRANSPORT,
        _E._ALL_BROKERS_DOWN,
        _E._RESOLVE,
        _E._QUEUE_FULL,
        _E._AUTHENTICATION,
        _E._SSL,
        _E.SASL_AUTHENTICATION_FAILED,
        _E.REQUEST_TIMED_OUT,
        _E.NETWORK_EXCEPTION,
        _E.BROKER_NOT_AVAILABLE,
        _E.LEADER_NOT_AVAILABLE,
        _E.NOT_ENOUGH_REPLICAS,
        _E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    }
)

#: Errors that say the producer's idempotence state (producer id, epoch,
#: sequence numbers) is out of step with the broker: no retry through this
#: producer can succeed, a new producer can, and the event is not to blame.
PRODUCER_STATE_ERRORS = frozenset(
    {
        _E.PRODUCER_FENCED,
        _E.INVALID_PRODUCER_EPOCH,
        _E.UNKNOWN_PRODUCER_ID,
        _E.OUT_OF_ORDER_SEQUENCE_NUMBER,
        _E.INVALID_PRODUCER_ID_MAPPING,
        _E._FENCED,
    }
)

# Settings a sink URL may not weaken: the contract promises acks=all plus idempotence.
_GUARANTEES = {
    "acks": {"all", "-1"},
    "request.required.acks": {"all", "-1"},
    "enable.idempotence": {"true", "1"},
}


def describe(error: KafkaError) -> str:
    """A short, payload-free description of ``error`` for logs and ``last_error``."""
    return f"kafka {error.name()}: {error.str()}"[:MAX_ERROR_CHARS]


def classify(error: KafkaError) -> Failure:
    """Turn a delivery or produce error into a :class:`Failure`."""
    return Failure(describe(error), permanent=error.code() in PERMANENT_ERRORS)


def is_unreachable(error: KafkaError) -> bool:
    """Whether ``error`` says the cluster could not be reached rather than refused a message."""
    return error.code() in UNREACHABLE_ERRORS


def producer_config(config: KafkaSinkConfig, *, publish_timeout_seconds: float, client_id: str) -> dict[str, Any]:
    """The librdkafka settings for the relay's producer; ``config.options`` win."""
    timeout_ms = max(1, round(publish_timeout_seconds * 1000))
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        # Java's default partitioner: a key lands on the same partition as from a Java client.
        "partitioner": "murmur2_random",
        "message.timeout.ms": timeout_ms,
        # Report a missing topic well before the message times out, so it is dead-lettered
        # as unknown rather than retried forever as "timed out".
        "topic.metadata.propagation.max.ms": min(30_000, max(1_000, timeout_ms // 2)),
        "linger.ms": LINGER_MS,
        "batch.num.messages": BATCH_NUM_MESSAGES,
        "queue.buffering.max.messages": QUEUE_BUFFERING_MAX_MESSAGES,
        "log.connection.close": False,
    }
    for name, allowed in _GUARANTEES.items():
        value = config.options.get(name)
        if value is not None and value.strip().lower() not in allowed:
            raise ConfigError(f"kafka option {name}={value!r} would break delivery guarantees; remove it")
    settings.update(config.options)
    return settings


class _Batch:
    """The delivery state of one ``publish`` call, shared with librdkafka's callbacks.

    Slots start as ``_NOT_REPORTED``; whatever is still unreported when the wait
    ends counts as a timeout.
    """

    __slots__ = ("_finished", "_future", "_lock", "_loop", "_remaining", "acked", "results", "unreachable")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self._lock = threading.Lock()
        self._loop = loop
        self._future: asyncio.Future[None] = loop.create_future()
        self._remaining = size
        self._finished = False
        self.results: list[Outcome] = [_NOT_REPORTED] * size
        self.acked = 0
        self.unreachable = 0

    @property
    def future(self) -> asyncio.Future[None]:
        """Resolved once every event has an outcome."""
        return self._future

    def on_delivery(self, index: int, error: KafkaError | None, _message: Message[Any, Any]) -> None:
        """librdkafka's delivery report for event ``index`` (runs on the poll thread)."""
        if error is None:
            self.record(index, None)
        else:
            self.record(index, classify(error), unreachable=is_unreachable(error))

    def record(self, index: int, outcome: Outcome, *, unreachable: bool = False) -> None:
        """Set the outcome of event ``index``."""
        with self._lock:
            if self._finished:
                return
            self.results[index] = outcome
            if outcome is None:
                self.acked += 1
            elif unreachable:
                self.unreachable += 1
            self._remaining -= 1
            if self._remaining == 0:
                self._finish_locked()

    def fail_unreported(self, failure: Failure, *, unreachable: bool, start: int = 0) -> None:
        """Fail every event from ``start`` on that has no outcome yet."""
        with self._lock:
            if self._finished:
                return
            for index in range(start, len(self.results)):
                if self.results[index] is _NOT_REPORTED:
                    self.results[index] = failure
                    self._remaining -= 1
                    if unreachable:
                        self.unreachable += 1
            if self._remaining == 0:
                self._finish_locked()

    def close(self) -> list[Outcome]:
        """Stop accepting reports; whatever is unreported timed out."""
        with self._lock:
            if not self._finished:
                self._finished = True
                self.unreachable += self._remaining
            return list(self.results)

    def _finish_locked(self) -> None:
        self._finished = True
        try:
            self._loop.call_soon_threadsafe(self._resolve)
        except RuntimeError:
            # The loop is closed: the publish call that waited on this batch is gone.
            logger.debug("kafka batch finished after its event loop closed", extra={"action": "kafka_late"})

    def _resolve(self) -> None:
        if not self._future.done():
            self._future.set_result(None)


_NOT_REPORTED = Failure("kafka: no delivery report within the publish timeout")


class _LibrdkafkaLog:
    """Receives librdkafka's log lines (served by ``poll``) and hands them to ``logging``.

    Connection failures (facility ``FAIL``) arrive through ``error_cb`` as well,
    where they are rate-limited, so here they go to DEBUG; so do librdkafka's
    INFO/NOTICE lines, which are chatter for an operator.
    """

    def __init__(self, redact: Callable[[str], str]) -> None:
        self._redact = redact

    def log(self, level: int, msg: str, *args: object) -> None:
        """``logging.Logger.log``'s signature, which confluent-kafka calls."""
        facility = str(args[0]) if args else ""
        if level < logging.WARNING or facility == "FAIL":
            level = logging.DEBUG
        if librdkafka_logger.isEnabledFor(level):
            text = self._redact(msg % args if args else msg)
            librdkafka_logger.log(level, "%s", text, extra={"action": "librdkafka_log"})


class _Client:
    """One librdkafka producer and the thread that serves its callbacks."""

    def __init__(self, settings: dict[str, Any], redact: Callable[[str], str]) -> None:
        self._redact = redact
        self._lock = threading.Lock()
        self._pending: set[_Batch] = set()
        self._last_logged: dict[int, float] = {}
        self.broken: str | None = None
        try:
            self.producer = Producer({**settings, "error_cb": self._on_error, "logger": _LibrdkafkaLog(redact)})
        except KafkaException as exc:
            raise ConfigError(f"invalid kafka settings: {redact(describe(_error_of(exc)))}") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-poll", daemon=True)
        self._thread.start()

    def add(self, batch: _Batch) -> None:
        """Track ``batch`` so a fatal error can fail it at once."""
        with self._lock:
            if self.broken is None:
                self._pending.add(batch)
                return
            reason = self.broken
        batch.fail_unreported(Failure(reason), unreachable=False)

    def discard(self, batch: _Batch) -> None:
        """Stop tracking ``batch``."""
        with self._lock:
            self._pending.discard(batch)

    def mark_broken(self, reason: str, *, unreachable: bool = False) -> None:
        """Fail every pending batch; the sink builds a new producer before the next batch.

        ``unreachable`` when the events are not to blame, so their attempts are not spent.
        """
        with self._lock:
            if self.broken is None:
                self.broken = reason
            batches = list(self._pending)
        for batch in batches:
            batch.fail_unreported(Failure(reason), unreachable=unreachable)

    def on_delivery(self, batch: _Batch, index: int, error: KafkaError | None, message: Message[Any, Any]) -> None:
        """librdkafka's delivery report (poll thread): retire a producer whose idempotence state is lost."""
        if error is not None and error.code() in PRODUCER_STATE_ERRORS:
            reason = self._redact(describe(error))
            if self.broken is None:
                logger.warning(
                    "kafka producer out of step with the broker; a new producer takes over: %s",
                    reason,
                    extra={"action": "kafka_producer_reset"},
                )
            batch.record(index, Failure(reason), unreachable=True)
            self.mark_broken(reason, unreachable=True)
            return
        batch.on_delivery(index, error, message)

    def shutdown(self, flush_timeout_seconds: float) -> None:
        """Deliver what can be delivered within the timeout, then drop the rest (blocking)."""
        self._stop.set()
        self._thread.join()
        if flush_timeout_seconds > 0:
            left = self.producer.flush(flush_timeout_seconds)
            if left:
                logger.warning(
                    "kafka close: %d messages not acknowledged in %.0fs; they stay in the outbox",
                    left,
                    flush_timeout_seconds,
                    extra={"action": "kafka_close_unflushed"},
                )
        # Purged messages report _PURGE_*; their batches are failed below anyway.
        self.producer.purge(in_queue=True, in_flight=True)
        self.producer.poll(0)
        self.mark_broken("kafka: sink closed before the broker acknowledged")
        self.producer.close()

    def _serve(self) -> None:
        poll = self.producer.poll
        while not self._stop.is_set():
            try:
                poll(POLL_INTERVAL_SECONDS)
            except Exception:
                # A callback raised: no outcome of this producer can be trusted any more.
                logger.exception("kafka poll thread failed", extra={"action": "kafka_poll_failed"})
                self.mark_broken("kafka: poll thread failed")
                return

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal() or error.code() == KafkaError._FATAL:
            reason = self._redact(describe(error))
            logger.error(
                "kafka producer fatal error; a new producer takes over: %s", reason, extra={"action": "kafka_fatal"}
            )
            self.mark_broken(reason)
            return
        now = time.monotonic()
        last = self._last_logged.get(error.code())
        if last is None or now - last >= CLIENT_ERROR_LOG_INTERVAL_SECONDS:
            self._last_logged[error.code()] = now
            logger.warning(
                "kafka client error: %s",
                self._redact(describe(error)),
                extra={"action": "kafka_client_error"},
            )


def _nothing() -> None:
    """A no-op job: once it ran, every job submitted before it has finished."""


def _log_retire_failure(done: Future[None]) -> None:
    exc = done.exception()
    if exc is not None:
        logger.error("kafka: stopping the broken producer failed: %r", exc, extra={"action": "kafka_retire_failed"})


def _error_of(exc: KafkaException) -> KafkaError:
    if exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return KafkaError(KafkaError._FAIL, str(exc)[:MAX_ERROR_CHARS])


class KafkaSink:
    """Publishes events to Kafka with an idempotent, ``acks=all`` producer.

    Use from one asyncio event loop: ``await start()``, then ``publish`` batches
    (several may be in flight at once; they are enqueued in call order), then
    ``await close()``.
    """

    name = "kafka"

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
        self._secrets = [v for k, v in config.options.items() if v and is_secret_option(k)]
        self._client: _Client | None = None
        self._closed = False
        self._last_ack = -float("inf")
        # One thread, so batches reach librdkafka in the order publish() was called.
        self._producing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-produce")

    async def start(self) -> None:
        """Build the producer and check that a broker answers; raise ``SinkUnavailable`` if not."""
        if self._closed:
            raise SinkError("kafka sink is closed")
        if self._client is None:
            self._client = _Client(self._settings, self._redact)
        try:
            await self._probe(self._client, self._connect_timeout_seconds)
        except SinkUnavailable:
            client, self._client = self._client, None
            await asyncio.to_thread(client.shutdown, 0)
            raise
        logger.info("kafka sink connected to %s", self._config.bootstrap_servers, extra={"action": "kafka_connected"})

    async def publish(self, events: Sequence[Event]) -> list[Outcome]:
        """Publish ``events`` and return one outcome per event, in order."""
        if not events:
            return []
        client = self._usable_client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._publish_timeout_seconds + WAIT_MARGIN_SECONDS
        batch = _Batch(len(events), loop)
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
            reason = first.error if first is not None else "no acknowledgement"
            raise SinkUnavailable(f"kafka at {self._config.bootstrap_servers} unreachable: {reason}")
        failed = len(events) - batch.acked
        if failed:
            logger.warning(
                "kafka: %d of %d events not acknowledged",
                failed,
                len(events),
                extra={"action": "kafka_publish_failed", "batch_size": len(events)},
            )
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

    def _usable_client(self) -> _Client:
        if self._closed:
            raise SinkError("kafka sink is closed")
        client = self._client
        if client is None:
            raise SinkError("kafka sink is not started")
        if client.broken is None:
            return client
        # A fatal error poisons the producer (e.g. its idempotence state); start afresh.
        logger.warning("kafka: replacing the broken producer", extra={"action": "kafka_rebuild"})
        self._client = _Client(self._settings, self._redact)
        # Queued behind any batch still being enqueued into the old producer.
        self._producing.submit(client.shutdown, 0).add_done_callback(_log_retire_failure)
        return self._client

    async def _probe(self, client: _Client, timeout_seconds: float) -> None:
        try:
            await asyncio.to_thread(client.producer.list_topics, timeout=timeout_seconds)
        except KafkaException as exc:
            reason = self._redact(describe(_error_of(exc)))
            where = self._config.bootstrap_servers
            raise SinkUnavailable(f"cannot reach kafka at {where} within {timeout_seconds:g}s: {reason}") from None

    @staticmethod
    def _produce_all(client: _Client, batch: _Batch, events: Sequence[Event], deadline: float) -> None:
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
                    error = _error_of(exc)
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

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text
