"""The log source's batches are charged in the batch room, as the table's are (relay/batch/costs.py).

A publish that times out counts its events as failed attempts and halves the
next batches; only a batch acknowledged in time ends the timeouts' backoff (a
batch all held says nothing of the broker). Before the log source used the
room, it counted no failed attempt, never shrank, and a batch all held ended
the backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import cast

from relay.backoff import Backoff, OutageBackoff
from relay.errors import SinkTimeout
from relay.events import HELD, Event, Outcome
from relay.holds import KeyHolds
from relay.metrics import Metrics
from relay.sources.log.batches import Batches
from relay.sources.log.slot import TableLink
from relay.sources.log.window import Window
from tests.unit.test_loop import FAST

Answer = Callable[[Sequence[Event]], list[Outcome]]


class ScriptedSink:
    """Answers each ``publish`` with the next of ``script``, and keeps the batches it was handed."""

    name = "scripted"
    chains_keys = True

    def __init__(self, script: list[Answer]) -> None:
        self.script = script
        self.batches: list[list[int]] = []

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        self.batches.append([e.id for e in events])
        return self.script.pop(0)(events)


def times_out(events: Sequence[Event]) -> list[Outcome]:
    raise SinkTimeout("no acknowledgement within the publish timeout")


def all_held(events: Sequence[Event]) -> list[Outcome]:
    return [HELD] * len(events)


def all_acknowledged(events: Sequence[Event]) -> list[Outcome]:
    return [None] * len(events)


def batches_over(sink: ScriptedSink, count: int) -> tuple[Batches, Metrics, OutageBackoff]:
    window = Window(max_events=1000, max_bytes=1 << 20)
    transaction = window.begin()
    metrics, timeouts = Metrics(), OutageBackoff()
    batches = Batches(
        window,
        sink,  # type: ignore[arg-type]
        cast(TableLink, None),  # no dead letter or parked key in these cases
        FAST,
        metrics,
        backoff=Backoff(FAST.backoff_initial_seconds, FAST.backoff_max_seconds),
        timeouts=timeouts,
        sink_outage=OutageBackoff(),
        depth=1,
    )
    now = datetime.now(UTC)
    for i in range(1, count + 1):
        event = Event(i, "t", f"k{i}", b"{}", {}, f"id-{i}", 0, now)
        batches.ready.append(window.add(event, transaction, row=False))
    return batches, metrics, timeouts


async def round_trip(batches: Batches) -> None:
    """Hand one batch to the sink and settle what it answered; what went back is due at once."""
    await batches.send_more()
    to_sink, sending = batches.in_flight.popleft()
    await batches.settle(to_sink, await sending)
    for blocked in batches.blocked.values():
        blocked.due = 0.0
    batches.release_due()


def test_a_timeout_counts_failed_attempts_and_halves_the_next_batch() -> None:
    sink = ScriptedSink([times_out, all_acknowledged])
    batches, metrics, timeouts = batches_over(sink, FAST.batch_size)

    async def scenario() -> None:
        await round_trip(batches)
        await round_trip(batches)

    asyncio.run(scenario())
    assert [len(b) for b in sink.batches] == [FAST.batch_size, FAST.batch_size // 2]
    assert metrics.failed_attempts._value.get() == FAST.batch_size
    assert timeouts.failures == 0, "the acknowledged batch ended the timeouts' backoff"


def test_a_batch_all_held_after_a_timeout_does_not_end_the_timeouts() -> None:
    sink = ScriptedSink([times_out, all_held])
    batches, _, timeouts = batches_over(sink, FAST.batch_size)

    async def scenario() -> None:
        await round_trip(batches)
        await round_trip(batches)

    asyncio.run(scenario())
    assert timeouts.failures == 1
    assert len(batches.ready) == FAST.batch_size, "all ten back in hand: five held, five not taken"
    assert all(p.event.attempts == 0 for p in batches.ready), "held back: no attempt spent"
