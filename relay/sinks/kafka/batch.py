"""The delivery state of one ``publish`` call, shared with librdkafka's delivery reports.

Every event the batch will not report acknowledged puts its key on hold as
soon as that is known (:meth:`relay.sinks.keyorder.Turns.hold`), so a later
event of the key is not handed to the producer after it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message

from relay.events import HELD, Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.sinks.kafka.errors import classify, is_unreachable
from relay.sinks.keyorder import Turns

logger = logging.getLogger(__name__)


class Batch:
    """The delivery state of one ``publish`` call, shared with librdkafka's callbacks.

    Slots start as ``NOT_REPORTED``; whatever is still unreported when the wait
    ends counts as a timeout. ``unreachable`` counts the events that failed
    because the cluster could not be reached or did not answer in time,
    ``timed_out`` those among them that the broker may have stored, ``held``
    those not handed over because an earlier event of their key failed.
    """

    __slots__ = (
        "_failed",
        "_finished",
        "_future",
        "_lock",
        "_loop",
        "_remaining",
        "acked",
        "held",
        "results",
        "timed_out",
        "turns",
        "unreachable",
    )

    def __init__(
        self,
        events: Sequence[Event],
        loop: asyncio.AbstractEventLoop,
        holds: KeyHolds | None = None,
        failed: Callable[[Batch, int, KafkaError, Any], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        #: Where :meth:`delivered` hands a failed report (the client's check for a lost producer).
        self._failed = failed
        self._loop = loop
        self._future: asyncio.Future[None] = loop.create_future()
        #: The events' place in their keys' order: admitted (produce thread) and held (either thread) there.
        self.turns = Turns(events, holds)
        self._remaining = len(events)
        self._finished = False
        self.results: list[Outcome] = [NOT_REPORTED] * len(events)
        self.acked = 0
        self.unreachable = 0
        self.timed_out = 0
        self.held = 0

    @property
    def future(self) -> asyncio.Future[None]:
        """Resolved once every event has an outcome."""
        return self._future

    @property
    def finished(self) -> bool:
        """Whether every event has an outcome (or the batch was closed)."""
        with self._lock:
            return self._finished

    def delivered(self, index: int, error: KafkaError | None, message: Message[Any, Any] | None) -> None:
        """librdkafka's delivery report for event ``index``, bound per message (poll or produce thread).

        One frame for an acknowledgement, the common case: every message calls it.
        A failed report goes to ``failed`` (the client), else to :meth:`on_delivery`."""
        if error is not None:
            if self._failed is not None:
                self._failed(self, index, error, message)
            else:
                self.on_delivery(index, error, message)
            return
        with self._lock:
            if self._finished or self.results[index] is not NOT_REPORTED:
                return
            self.results[index] = None
            self.acked += 1
            self._remaining -= 1
            if self._remaining == 0:
                self._finish_locked()

    def on_delivery(self, index: int, error: KafkaError | None, _message: Message[Any, Any] | None) -> None:
        """librdkafka's delivery report for event ``index`` (runs on the poll thread)."""
        if error is None:
            self.record(index, None)
        else:
            self.record(index, classify(error), unreachable=is_unreachable(error))

    def record(self, index: int, outcome: Outcome, *, unreachable: bool = False) -> None:
        """Set the outcome of event ``index``; a failure holds its key at once."""
        with self._lock:
            if self._finished or self.results[index] is not NOT_REPORTED:
                return
            self.results[index] = outcome
            if outcome is None:
                self.acked += 1
            else:
                self._hold_locked([index])
                if unreachable:
                    self.unreachable += 1
                    self.timed_out += outcome.timed_out
            self._remaining -= 1
            if self._remaining == 0:
                self._finish_locked()

    def refuse(self, index: int) -> None:
        """Answer event ``index`` :data:`HELD`: its key is on hold, so it is not handed over."""
        with self._lock:
            if self._finished or self.results[index] is not NOT_REPORTED:
                return
            self.results[index] = HELD
            self.held += 1
            self._remaining -= 1
            if self._remaining == 0:
                self._finish_locked()

    def fail_unreported(self, failure: Failure, *, unreachable: bool, start: int = 0) -> None:
        """Fail every event from ``start`` on that has no outcome yet (and hold their keys)."""
        with self._lock:
            if self._finished:
                return
            failed = [i for i in range(start, len(self.results)) if self.results[i] is NOT_REPORTED]
            for index in failed:
                self.results[index] = failure
            self._hold_locked(failed)
            self._remaining -= len(failed)
            if unreachable:
                self.unreachable += len(failed)
                self.timed_out += len(failed) * failure.timed_out
            if self._remaining == 0:
                self._finish_locked()

    def hold_unacknowledged(self) -> None:
        """Hold the key of every event not acknowledged so far (some may still be, later)."""
        with self._lock:
            self._hold_locked([i for i, outcome in enumerate(self.results) if outcome is not None])

    def close(self) -> list[Outcome]:
        """Stop accepting reports; whatever is unreported timed out (and its key is held)."""
        with self._lock:
            if not self._finished:
                self._finished = True
                self._hold_locked([i for i, outcome in enumerate(self.results) if outcome is NOT_REPORTED])
                self.unreachable += self._remaining
                self.timed_out += self._remaining
            return list(self.results)

    def _hold_locked(self, indices: list[int]) -> None:
        if indices:
            self.turns.hold(indices)

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
