"""What a take of the log source hands out (relay/sources/log/queue.py): commit order, a key's events never
past one of its events taken or given back, chained only when the batches in hand go on with the key; and
the log source (relay/sources/log/source.py) under the batch room the loop drives, as the table is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from relay.batch import Costs, Deliveries
from relay.batch.life import hand_to_sink
from relay.batching import BatchLimits
from relay.config import TableName
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.log_relay import LogRelay
from relay.loop import Relay
from relay.metrics import Metrics
from relay.sinks.memory import MemorySink
from relay.sources.log.leader import Leader
from relay.sources.log.queue import Reading
from relay.sources.log.source import LogSource
from relay.sources.log.window import Window
from relay.store.claims import Dead, Retry
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def _reading(keys: list[str | None]) -> Reading:
    reading = Reading(Window(max_events=1000, max_bytes=1 << 20))
    transaction = reading.window.begin()
    for i, key in enumerate(keys, start=1):
        event = Event(i, "t", key, b"{}", {}, f"id-{i}", 0, NOW)
        reading.ready.append(reading.window.add(event, transaction, row=True))
    transaction.end_lsn = 100
    return reading


def _ids(reading: Reading, limit: int = 10, going_on: tuple[str, ...] = ()) -> list[int]:
    taken = reading.take(uuid4(), limit, 1 << 20, lambda: going_on)
    return [p.id for p in taken.batch]


def test_a_key_in_flight_waits_unless_the_batches_in_hand_go_on_with_it() -> None:
    reading = _reading(["a", "a", "b", None, "a"])
    token = uuid4()
    first = reading.take(token, 2, 1 << 20, lambda: ())
    assert [p.id for p in first.batch] == [1, 2]
    assert [p.chained for p in first.batch] == [False, True]
    assert all(p.attempts == 1 for p in first.batch)
    # Key a is in flight and not gone on with: its event 5 waits, the others go.
    assert _ids(reading) == [3, 4]
    assert reading.take(uuid4(), 10, 1 << 20, lambda: ()).batch == []
    # Once a's events are confirmed, 5 is due and goes, unchained.
    for pending in reading.untake(token, [1, 2]):
        reading.done(pending)
    taken = reading.take(uuid4(), 10, 1 << 20, lambda: ())
    assert [(p.id, p.chained) for p in taken.batch] == [(5, False)]
    assert reading.delivered_rows == [1, 2]


def test_a_key_gone_on_with_is_chained() -> None:
    reading = _reading(["a", "a", "a"])
    reading.take(uuid4(), 1, 1 << 20, lambda: ())
    taken = reading.take(uuid4(), 10, 1 << 20, lambda: ("a",))
    assert [(p.id, p.chained) for p in taken.batch] == [(2, True), (3, True)]


def test_an_event_given_back_goes_again_before_its_keys_later_events_and_others_flow_on() -> None:
    reading = _reading(["a", "a", "b"])
    token = uuid4()
    reading.take(token, 1, 1 << 20, lambda: ())
    (back,) = reading.untake(token, [1])
    reading.block(back, time.monotonic() + 60, retrying=True)
    assert reading.window.held == 1
    assert _ids(reading) == [3], "a waits for its retry; b goes on"
    reading.blocked["a"].due = 0.0
    assert _ids(reading) == [1, 2], "due again: a's events in their order"
    assert reading.window.held == 0


def test_a_late_give_back_still_goes_before_the_later_events_that_waited() -> None:
    reading = _reading(["a", "a", "a"])
    token, later = uuid4(), uuid4()
    reading.take(token, 1, 1 << 20, lambda: ())
    reading.take(later, 1, 1 << 20, lambda: ("a",))  # event 2, chained on 1
    (two,) = reading.untake(later, [2])
    reading.block(two, 0.0)  # held: its key's chain broke
    assert _ids(reading) == [], "a still has event 1 in flight: nothing of a goes"
    (one,) = reading.untake(token, [1])
    reading.block(one, 0.0)
    assert _ids(reading) == [1, 2, 3]


def test_parked_keys_and_bad_envelopes_go_to_the_table_not_the_sink() -> None:
    reading = _reading(["p", None, "q"])
    reading.parked.add("p")
    bad = reading.ready[1]
    reading.bad[id(bad)] = "not JSON"
    taken = reading.take(uuid4(), 10, 1 << 20, lambda: ())
    assert [p.id for p in taken.batch] == [3]
    assert [p.id for p in taken.parked] == [1]
    assert [(p.id, why) for p, why in taken.bad] == [(2, "not JSON")]


class BrokenSink(MemorySink):
    """A sink with a bug: its first publish raises."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        if self.broken:
            self.broken = False
            raise RuntimeError("a bug in the sink")
        return await super().publish(events, holds)


def _log_room(keys: list[str | None], sink: MemorySink) -> tuple[LogSource, Deliveries, Reading]:
    metrics = Metrics()
    source = LogSource(Leader("postgresql://unused", TableName.parse("outbox"), "s", sink, FAST, metrics))
    reading = _reading(keys)
    source.leader.reading = reading  # as a leader that reads would (no server: nothing here writes)
    costs = Costs(FAST, metrics, BatchLimits(FAST.batch_size, FAST.batch_bytes))
    return source, Deliveries(source, sink, FAST, metrics, costs, recurring=False), reading


def test_the_loops_batch_room_lives_a_log_batch_and_the_source_confirms_it() -> None:
    sink = MemorySink()
    source, deliveries, reading = _log_room(["a", "a", None], sink)

    async def scenario() -> None:
        read = list(reading.ready)
        claim = await (await source.take(10, max_bytes=1 << 20)).events()
        assert [e.id for e in claim.events] == [1, 2, 3]
        assert all(e is p for e, p in zip(claim.events, read, strict=True)), "the window's entries, not copies"
        assert await source.renew(claim) == {1, 2, 3}, "nothing leased: a renewal keeps every event"
        await deliveries.deliver(deliveries.take(claim, time.monotonic()))

    asyncio.run(scenario())
    assert [e.id for e in sink.delivered] == [1, 2, 3]
    assert reading.settled() and reading.delivered_rows == [1, 2, 3]
    assert reading.window.confirmable() == 100, "all done: the transaction may be confirmed"


def test_a_log_batch_whose_task_fails_holds_its_keys_and_a_give_back_keeps_their_order() -> None:
    sink = BrokenSink()
    source, deliveries, reading = _log_room(["a", "a", "b"], sink)

    async def scenario() -> None:
        claim = await (await source.take(1, max_bytes=1 << 20)).events()
        with pytest.raises(RuntimeError):
            await deliveries.deliver(deliveries.take(claim, time.monotonic()))
        assert deliveries.holds.held("a"), "a batch that died holds its keys, as a table batch does"
        # The batch in hand goes back unpublished: no attempt spent, and its key's later event waits.
        await source.give_back(claim, [1], delay_seconds=60)
        later = await (await source.take(10, max_bytes=1 << 20)).events()
        assert [e.id for e in later.events] == [3]
        assert [(p.id, p.attempts) for p in reading.blocked["a"].events] == [(1, 0), (2, 0)]

    asyncio.run(scenario())
    assert reading.window.confirmable() is None


def test_a_retry_waits_in_memory_behind_its_key_with_its_attempt_spent() -> None:
    source, _, reading = _log_room(["a", "a", "b"], MemorySink())

    async def scenario() -> None:
        claim = await (await source.take(1, max_bytes=1 << 20)).events()
        settled = await source.confirm(claim, 0.0, retry=[Retry(1, 60.0, "refused")])
        assert settled is not None and settled.retried == 1
        assert reading.blocked["a"].retrying and reading.window.held == 1
        assert reading.blocked["a"].events[0].attempts == 1
        later = await (await source.take(10, max_bytes=1 << 20)).events()
        assert [e.id for e in later.events] == [3]

    asyncio.run(scenario())


def test_only_the_table_relay_keeps_recurring_keys_the_log_takes_every_key_in_hand() -> None:
    """The log's take goes on with every key of the batches in hand: its relay builds no sets of recurring keys
    per take and per batch (the table's claim needs them)."""
    log = LogRelay("postgresql://unused", TableName.parse("outbox"), "s", MemorySink(), FAST)
    assert not log.deliveries.recurring and Relay(MemoryStore(), MemorySink(), FAST).deliveries.recurring
    sink = MemorySink()
    source, deliveries, _ = _log_room(["a", "a", "b"], sink)

    async def scenario() -> None:
        first = await (await source.take(1, max_bytes=1 << 20)).events()
        batch = deliveries.take(first, time.monotonic())
        chain = deliveries.chain(time.monotonic())
        assert [c.recurring for c in chain] == [frozenset()]
        second = await (await source.take(10, max_bytes=1 << 20, chain=chain)).events()
        assert [(e.id, e.chained) for e in second.events] == [(2, True), (3, False)]
        await deliveries.deliver(batch)
        await deliveries.deliver(deliveries.take(second, time.monotonic()))

    asyncio.run(scenario())
    assert not deliveries.recent_keys and [e.id for e in sink.delivered] == [1, 2, 3]


@pytest.mark.parametrize(
    ("keys", "failing", "dead", "retry"),
    [
        (["x", "a", "a"], {1, 2}, [1], [2]),  # another key's dead letter, while a's earlier event waits for a retry
        (["a", "a"], {1}, [1], []),  # the key's own dead letter: the key parks
        (["a", "a", "a"], {1}, [1], []),  # the same, two events behind it
        (["a", "b", "a"], {1, 2}, [1, 2], []),  # two keys dead-lettered in one batch
    ],
)
def test_a_take_while_the_source_settles_a_batch_chains_the_keys_of_that_batch(
    keys: list[str], failing: set[int], dead: list[int], retry: list[int]
) -> None:
    """The source confirms a batch in awaits (a dead letter's INSERT is a round trip) and the loop's next take may
    run meanwhile: an event of a key of that batch is still chained (the batch is in hand until the room ends
    it) and must not lift the key's hold, whatever the source's own counts say by then. Nothing of a key with an
    event dead-lettered or waiting for a retry reaches the sink. (A review found a take unchained then.)"""
    sink = MemorySink(fail=lambda e: Failure("boom") if e.id in failing else None)
    source, deliveries, _ = _log_room(list(keys), sink)
    writing = asyncio.Event()
    written = asyncio.Event()

    async def write(event: Event, **_: object) -> None:  # the dead letter's INSERT, a round trip
        writing.set()
        await written.wait()

    source.leader.link.write = write  # type: ignore[method-assign]
    first_size = max(dead + retry)

    async def scenario() -> list[tuple[int, bool]]:
        first = await (await source.take(first_size, max_bytes=1 << 20)).events()
        in_hand = deliveries.take(first, time.monotonic())
        await hand_to_sink(sink, first.events, deliveries.holds)
        settling = asyncio.create_task(
            source.confirm(
                first,
                time.monotonic() + 30,
                dead=[Dead(i, "boom") for i in dead],
                retry=[Retry(i, 60.0, "boom") for i in retry],
            )
        )
        await writing.wait()  # the settle waits on the database
        second = await (await source.take(10, max_bytes=1 << 20, chain=deliveries.chain(time.monotonic()))).events()
        deliveries.take(second, time.monotonic())
        outcomes = await hand_to_sink(sink, second.events, deliveries.holds)
        written.set()
        await settling
        deliveries.end(in_hand)
        assert isinstance(outcomes, list)
        return [(e.id, o is None) for e, o in zip(second.events, outcomes, strict=True)]

    second = asyncio.run(scenario())
    behind = {i for i, key in enumerate(keys, 1) if i > first_size and key in {keys[j - 1] for j in dead + retry}}
    assert not behind & {e.id for e in sink.delivered}, (second, [e.id for e in sink.delivered])
