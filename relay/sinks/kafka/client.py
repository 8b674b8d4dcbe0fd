"""One librdkafka producer, the thread that serves its callbacks, and its log lines."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from relay.errors import ConfigError
from relay.events import Failure
from relay.sinks.kafka.batch import Batch
from relay.sinks.kafka.errors import PRODUCER_STATE_ERRORS, TIMEOUT_ERRORS, UNREACHABLE_ERRORS, describe, error_of

logger = logging.getLogger(__name__)
librdkafka_logger = logging.getLogger("relay.sinks.kafka.librdkafka")

POLL_INTERVAL_SECONDS = 0.05
CLIENT_ERROR_LOG_INTERVAL_SECONDS = 30.0


class LibrdkafkaLog:
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


class Client:
    """One librdkafka producer and the thread that serves its callbacks."""

    def __init__(self, settings: dict[str, Any], redact: Callable[[str], str]) -> None:
        self._redact = redact
        self._lock = threading.Lock()
        self._pending: set[Batch] = set()
        self._last_logged: dict[int, float] = {}
        self.broken: str | None = None
        #: When librdkafka last said a broker could not be reached (``time.monotonic``).
        self.unreachable_at = -float("inf")
        try:
            self.producer = Producer({**settings, "error_cb": self._on_error, "logger": LibrdkafkaLog(redact)})
        except KafkaException as exc:
            raise ConfigError(f"invalid kafka settings: {redact(describe(error_of(exc)))}") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-poll", daemon=True)
        self._thread.start()

    def add(self, batch: Batch) -> None:
        """Track ``batch`` so a fatal error can fail it at once."""
        with self._lock:
            if self.broken is None:
                self._pending.add(batch)
                return
            reason = self.broken
        batch.fail_unreported(Failure(reason), unreachable=False)

    def discard(self, batch: Batch) -> None:
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

    def on_delivery(self, batch: Batch, index: int, error: KafkaError | None, message: Message[Any, Any]) -> None:
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
        if error.code() in UNREACHABLE_ERRORS - TIMEOUT_ERRORS:
            self.unreachable_at = time.monotonic()
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
