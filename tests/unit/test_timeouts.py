"""A broker that stores messages but does not acknowledge them in time gets a bounded number of copies (no I/O).

The bound is derived in docs/delivery.md, "Timeouts and copies"; ``most_messages``
computes it for a stall of a given length.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import pytest

from relay.backoff import OUTAGE_BACKOFF_INITIAL_SECONDS, OUTAGE_BACKOFF_MAX_SECONDS
from relay.errors import SinkTimeout
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST

SETTINGS = replace(FAST, batch_size=16, max_attempts=1)
STALL_SECONDS = 3.0


def most_messages(seconds: float, batch: int, depth: int, publish_timeout: float) -> int:
    """The most messages one relay sends, in ``seconds``, to a broker that acknowledges nothing in time.

    The batches in hand when the first timeout comes; then one batch at a
    time, the one after the k-th timeout at most ``batch / 2**k`` events (at
    least one), sent no sooner than the k-th backoff delay after the timeout
    before it, which came no sooner than the publish timeout after its batch.
    """
    total = depth * batch
    sent_at, k = 0.0, 0
    while True:
        k += 1
        delay = min(OUTAGE_BACKOFF_INITIAL_SECONDS * 2 ** (k - 1), OUTAGE_BACKOFF_MAX_SECONDS)
        sent_at += publish_timeout + delay
        if sent_at > seconds:
            return total
        total += max(1, batch >> k)


class StallingSink(MemorySink):
    """Stores every message; while ``stalled``, acknowledges none in time (``partly``: every other one)."""

    def __init__(self, *, partly: bool) -> None:
        super().__init__()
        self.partly = partly
        self.stalled = True
        self.stored: list[tuple[float, Event]] = []
        self.batches: list[int] = []

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        self.stored.extend((time.monotonic(), e) for e in events)
        self.batches.append(len(events))
        if not self.stalled:
            return await super().publish(events, holds)
        if not self.partly:
            raise SinkTimeout("no acknowledgement within the publish timeout")
        outcomes: list[Outcome] = []
        for index, event in enumerate(events):
            if index % 2:
                outcomes.append(Failure("no acknowledgement within the publish timeout", timed_out=True))
            else:
                self.delivered.append(event)
                outcomes.append(None)
        return outcomes


@pytest.mark.parametrize("partly", [False, True], ids=["whole batches", "part of each batch"])
def test_a_stalled_broker_gets_a_bounded_number_of_copies_and_nothing_is_spent_or_lost(partly: bool) -> None:
    store, sink = MemoryStore(), StallingSink(partly=partly)
    for i in range(200):
        store.insert("t", {"i": i}, key=f"k{i % 50}")
    relay = Relay(store, sink, SETTINGS)

    async def scenario() -> tuple[float, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        await asyncio.sleep(STALL_SECONDS)
        stalled_until, batches = time.monotonic(), len(sink.batches)
        sink.stalled = False
        try:
            async with asyncio.timeout(30):
                while store.rows:
                    await asyncio.sleep(0.01)
        finally:
            stop.set()
            await task
        return stalled_until, batches

    stalled_until, batches_in_stall = asyncio.run(scenario())
    during = [event for at, event in sink.stored if at <= stalled_until]
    # The memory sink times out at once; a real one waits its publish timeout, which only lowers the bound.
    bound = most_messages(STALL_SECONDS, SETTINGS.batch_size, SETTINGS.pipeline_depth, publish_timeout=0.0)
    copies = len(during) - len({e.id for e in during})
    assert (len(during) if not partly else copies) <= bound, (len(during), copies, bound, sink.batches[:30])
    # Timeouts spend no attempt: with a single attempt allowed, events sent again after a timeout
    # are not dead-lettered; and everything is delivered, each key in order.
    assert max(Counter(e.id for e in during).values()) > SETTINGS.max_attempts
    assert not store.rows
    delivered = [e.id for e in sink.delivered]
    assert sorted(set(delivered)) == list(range(1, 201))
    for k in range(50):
        first_copies = list(dict.fromkeys(e.id for e in sink.delivered if e.key == f"k{k}"))
        assert first_copies == sorted(first_copies)
    # Acknowledged again: back to full batches.
    assert SETTINGS.batch_size in sink.batches[batches_in_stall:], sink.batches
    # Each message not acknowledged in time counts as a failed attempt ("Publishing fails" alerts on it),
    # though none is spent in the table; none dead-lettered.
    not_acknowledged = len(sink.stored) - len(sink.delivered)
    assert 0 < relay.metrics.failed_attempts._value.get() <= not_acknowledged
    assert relay.metrics.dead_lettered._value.get() == 0


def test_the_bound_is_one_message_per_publish_timeout_and_longest_delay_in_the_long_run() -> None:
    per_hour = most_messages(7200, 2000, 2, 30.0) - most_messages(3600, 2000, 2, 30.0)
    assert per_hour <= 3600 / (30.0 + OUTAGE_BACKOFF_MAX_SECONDS) + 1
    # Today's defaults: what a relay sends in its first minute of a stall, and each minute after the first hour.
    assert most_messages(60, 2000, 2, 30.0) == 2 * 2000 + 1000
