"""One librdkafka producer, the thread that serves its callbacks, and its log lines.

A producer whose messages can no longer all be acknowledged in order (the
publish deadline passed with messages unacknowledged, a fatal error, its
idempotence state lost) is retired: every batch pending on it is answered not
acknowledged and its keys held, its messages are purged, and it is closed on a
thread of its own while the sink builds a new one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from relay.errors import ConfigError
from relay.events import Failure
from relay.sinks.kafka.batch import Batch
from relay.sinks.kafka.errors import (
    PURGED_ERRORS,
    TIMEOUT_ERRORS,
    UNREACHABLE_ERRORS,
    describe,
    error_of,
    is_fatal,
)

logger = logging.getLogger(__name__)
librdkafka_logger = logging.getLogger("relay.sinks.kafka.librdkafka")

POLL_INTERVAL_SECONDS = 0.05
CLIENT_ERROR_LOG_INTERVAL_SECONDS = 30.0
#: How long a retired producer may take to close before ``shutdown`` stops waiting.
CLOSE_WAIT_SECONDS = 5.0
#: How long ``produce`` may wait for a message to leave when a batch is in (sends lingering messages at once).
SEND_NOW_SECONDS = 0.001


class LibrdkafkaLog:
    """Receives librdkafka's log lines (served by ``poll``) and hands them to ``logging``.

    Connection failures (facility ``FAIL``) arrive through ``error_cb`` as well,
    where they are rate-limited, so here they go to DEBUG; so do librdkafka's
    INFO/NOTICE lines, which are chatter for an operator. Once ``retired()``
    says the producer is on its way out, its lines (the purge it is retired
    with makes a gap, which librdkafka reports as fatal) go to DEBUG too: the
    sink logged why it retired it.
    """

    def __init__(self, redact: Callable[[str], str], retired: Callable[[], bool] = lambda: False) -> None:
        self._redact = redact
        self._retired = retired

    def log(self, level: int, msg: str, *args: object) -> None:
        """``logging.Logger.log``'s signature, which confluent-kafka calls."""
        facility = str(args[0]) if args else ""
        if level < logging.WARNING or facility == "FAIL" or _is_gapless_notice(facility, args) or self._retired():
            level = logging.DEBUG
        if librdkafka_logger.isEnabledFor(level):
            text = self._redact(msg % args if args else msg)
            librdkafka_logger.log(level, "%s", text, extra={"action": "librdkafka_log"})


def _is_gapless_notice(facility: str, args: tuple[object, ...]) -> bool:
    """librdkafka's warning that ``enable.gapless.guarantee`` is experimental: the relay sets it on purpose."""
    return facility == "CONFWARN" and any("enable.gapless.guarantee" in str(arg) for arg in args)


class Client:
    """One librdkafka producer and the thread that serves its callbacks.

    ``lock`` is held around every ``produce`` call and while the client is
    retired, so nothing enters a retired producer.
    """

    def __init__(self, settings: dict[str, Any], redact: Callable[[str], str]) -> None:
        self._redact = redact
        self.lock = threading.Lock()
        self._pending: set[Batch] = set()
        self._last_logged: dict[int, float] = {}
        #: Why the client was retired; set only after the keys of its pending batches are held.
        self.broken: str | None = None
        self._closer: threading.Thread | None = None
        #: When librdkafka last said a broker could not be reached (``time.monotonic``).
        self.unreachable_at = -float("inf")
        try:
            log = LibrdkafkaLog(redact, lambda: self.broken is not None)
            self.producer = Producer({**settings, "error_cb": self._on_error, "logger": log})
        except KafkaException as exc:
            raise ConfigError(f"invalid kafka settings: {redact(describe(error_of(exc)))}") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-poll", daemon=True)
        self._thread.start()

    def add(self, batch: Batch) -> None:
        """Track ``batch`` so that retiring the producer fails it at once."""
        with self.lock:
            if self.broken is None:
                self._pending.add(batch)
                return
            reason = self.broken
        batch.fail_unreported(Failure(reason), unreachable=True)

    def discard(self, batch: Batch) -> None:
        """Stop tracking ``batch``."""
        with self.lock:
            self._pending.discard(batch)

    def retire(self, reason: str) -> bool:
        """Answer every pending batch not acknowledged, purge the producer and close it (in the background).

        Each unacknowledged event fails as timed out (the broker may have it:
        no attempt is spent) and its key is held before anyone can see that the
        client is broken, so no later event of the key enters a new producer
        first. What the broker stored of a partition is a prefix of what was
        sent (idempotence), so purging keeps each key's order. False if the
        client was retired already. Safe from any thread, callbacks included.
        """
        with self.lock:
            if self.broken is not None:
                return False
            batches = list(self._pending)
            for batch in batches:
                batch.hold_unacknowledged()
            self.broken = reason
        failure = Failure(reason, timed_out=True)
        for batch in batches:
            batch.fail_unreported(failure, unreachable=True)
        self._closer = threading.Thread(target=self._close, name="kafka-retire", daemon=True)
        self._closer.start()
        return True

    def wait_closed(self, timeout_seconds: float) -> bool:
        """Wait for a retired producer to be closed; False if it is still closing."""
        closer = self._closer
        if closer is None:
            return False
        closer.join(timeout_seconds)
        return not closer.is_alive()

    def on_delivery(
        self, batch: Batch, index: int, error: KafkaError | None, message: Message[Any, Any] | None
    ) -> None:
        """A delivery report (poll thread): retire a producer whose idempotence state is lost.

        :meth:`Batch.delivered` takes the acknowledgements itself and hands the failures here."""
        if error is None:
            batch.record(index, None)
            return
        if error.code() in PURGED_ERRORS:
            batch.record(index, Failure(describe(error), timed_out=True), unreachable=True)
            return
        if is_fatal(error):
            reason = self._redact(describe(error))
            batch.record(index, Failure(reason, timed_out=True), unreachable=True)
            if self.retire(reason):
                logger.warning(
                    "kafka producer out of step with the broker; a new producer takes over: %s",
                    reason,
                    extra={"action": "kafka_producer_reset"},
                )
            return
        batch.on_delivery(index, error, message)

    def send_now(self) -> None:
        """Send lingering messages at once instead of after ``linger.ms`` (produce thread)."""
        try:
            self.producer.flush(SEND_NOW_SECONDS)
        except KafkaException as exc:
            self._fatal(exc)

    def shutdown(self, flush_timeout_seconds: float) -> None:
        """Deliver what can be delivered within the timeout, then drop the rest (blocking)."""
        if flush_timeout_seconds > 0 and self.broken is None:
            try:
                left = self.producer.flush(flush_timeout_seconds)
            except KafkaException as exc:
                self._fatal(exc)
            else:
                if left:
                    logger.warning(
                        "kafka close: %d messages not acknowledged in %.0fs; they stay in the outbox",
                        left,
                        flush_timeout_seconds,
                        extra={"action": "kafka_close_unflushed"},
                    )
        self.retire("kafka: sink closed before the broker acknowledged")
        self.wait_closed(flush_timeout_seconds + CLOSE_WAIT_SECONDS)

    def _close(self) -> None:
        """Purge, stop the poll thread, serve the purge reports, close (the retire thread)."""
        self._stop.set()
        producer = self.producer
        try:
            producer.purge(in_queue=True, in_flight=True)
        except KafkaException as exc:
            logger.debug("kafka purge failed: %s", self._redact(str(exc)), extra={"action": "kafka_purge_failed"})
        self._thread.join()
        # A KafkaException here is the fatal error the producer is retired for, reported already.
        with contextlib.suppress(KafkaException):
            producer.poll(0)
        try:
            producer.close()
        except (KafkaException, RuntimeError) as exc:
            logger.warning(
                "kafka: closing a retired producer failed: %s",
                self._redact(str(exc)),
                extra={"action": "kafka_retire_failed"},
            )
        else:
            logger.debug("kafka producer closed", extra={"action": "kafka_producer_closed"})

    def _serve(self) -> None:
        poll = self.producer.poll
        while not self._stop.is_set():
            try:
                poll(POLL_INTERVAL_SECONDS)
            except KafkaException as exc:
                # confluent-kafka raises a fatal error from poll() rather than calling error_cb.
                self._fatal(exc)
                return
            except Exception:
                # A callback raised: no outcome of this producer can be trusted any more.
                logger.exception("kafka poll thread failed", extra={"action": "kafka_poll_failed"})
                self.retire("kafka: poll thread failed")
                return

    def _fatal(self, exc: KafkaException) -> None:
        reason = self._redact(describe(error_of(exc)))
        if self.retire(reason):
            logger.error(
                "kafka producer fatal error; a new producer takes over: %s", reason, extra={"action": "kafka_fatal"}
            )

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in UNREACHABLE_ERRORS - TIMEOUT_ERRORS:
            self.unreachable_at = time.monotonic()
        if error.fatal() or error.code() == KafkaError._FATAL:
            reason = self._redact(describe(error))
            if self.retire(reason):
                logger.error(
                    "kafka producer fatal error; a new producer takes over: %s", reason, extra={"action": "kafka_fatal"}
                )
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
