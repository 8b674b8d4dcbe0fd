"""The delivery state of one ``publish`` call, shared with librdkafka's delivery reports."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from confluent_kafka import KafkaError, Message

from relay.events import Failure, Outcome
from relay.sinks.kafka.errors import classify, is_unreachable

logger = logging.getLogger(__name__)


class Batch:
    """The delivery state of one ``publish`` call, shared with librdkafka's callbacks.

    Slots start as ``NOT_REPORTED``; whatever is still unreported when the wait
    ends counts as a timeout. ``unreachable`` counts the events that failed
    because the cluster could not be reached or did not answer in time,
    ``timed_out`` those among them that the broker may have stored.
    """

    __slots__ = ("_finished", "_future", "_lock", "_loop", "_remaining", "acked", "results", "timed_out", "unreachable")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self._lock = threading.Lock()
        self._loop = loop
        self._future: asyncio.Future[None] = loop.create_future()
        self._remaining = size
        self._finished = False
        self.results: list[Outcome] = [NOT_REPORTED] * size
        self.acked = 0
        self.unreachable = 0
        self.timed_out = 0

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
                self.timed_out += outcome.timed_out
            self._remaining -= 1
            if self._remaining == 0:
                self._finish_locked()

    def fail_unreported(self, failure: Failure, *, unreachable: bool, start: int = 0) -> None:
        """Fail every event from ``start`` on that has no outcome yet."""
        with self._lock:
            if self._finished:
                return
            for index in range(start, len(self.results)):
                if self.results[index] is NOT_REPORTED:
                    self.results[index] = failure
                    self._remaining -= 1
                    if unreachable:
                        self.unreachable += 1
                        self.timed_out += failure.timed_out
            if self._remaining == 0:
                self._finish_locked()

    def close(self) -> list[Outcome]:
        """Stop accepting reports; whatever is unreported timed out."""
        with self._lock:
            if not self._finished:
                self._finished = True
                self.unreachable += self._remaining
                self.timed_out += self._remaining
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


NOT_REPORTED = Failure("kafka: no delivery report within the publish timeout", timed_out=True)
