"""Interleavings of take, confirm and the leader's sweep that once let a key's later event past an earlier one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from relay.batch.life import hand_to_sink
from relay.events import Event, Failure
from relay.sinks.memory import MemorySink
from relay.store.claims import Dead, Retry
from tests.unit.test_log_queue import NOW, _log_room


@pytest.mark.parametrize("gap", ["claim_ahead", "take_writes_a_parked_event"])
def test_a_take_whose_batch_enters_the_room_after_the_dead_letters_batch_ended_stays_chained(gap: str) -> None:
    """The source's confirm untakes batch 1 (key a's count drops to 0), then awaits event 1's dead-letter
    INSERT. A take meanwhile hands out event 2 of key a unchained (the source's count is 0, a not parked yet).
    The batch room's mark_chained only saves it if batch 1 is still in hand when the new claim enters the
    room (Deliveries.take). It is not when the claim enters later: a claim started ahead
    (Relay._claim_ahead: the loop awaits it on its next turn, often after _wait_for_delivery), or a take that
    itself awaits a write (a parked or bad event of another key) while batch 1's settle finishes. Then event 2
    is unchained, lifts a's hold, and reaches the sink past its key's dead letter."""
    keys: list[str | None] = ["a", "a"] if gap == "claim_ahead" else ["a", "j", "a"]
    sink = MemorySink(fail=lambda e: Failure("poison", permanent=True) if e.id == 1 else None)
    source, deliveries, reading = _log_room(keys, sink)
    if gap != "claim_ahead":
        reading.parked = {"j"}
    gates = {1: asyncio.Event(), 2: asyncio.Event()}
    started = {1: asyncio.Event(), 2: asyncio.Event()}
    written: list[int] = []

    async def write(event: Event, **_: object) -> None:  # a round trip to the database
        if event.id in gates:
            started[event.id].set()
            await gates[event.id].wait()
        written.append(event.id)

    source.leader.link.write = write  # type: ignore[method-assign]

    async def scenario() -> None:
        first = await (await source.take(1, max_bytes=1 << 20)).events()
        in_hand = deliveries.take(first, time.monotonic())
        await hand_to_sink(sink, first.events, deliveries.holds)
        assert deliveries.holds.held("a")
        settling = asyncio.create_task(source.confirm(first, time.monotonic() + 30, dead=[Dead(1, "poison")]))
        await started[1].wait()  # the dead letter's INSERT is on its way
        taking = asyncio.create_task(source.take(10, max_bytes=1 << 20, chain=deliveries.chain(time.monotonic())))
        if gap == "claim_ahead":
            started_ahead = await taking  # the claim ahead has its answer; the loop has not awaited it yet
        else:
            await started[2].wait()  # the take writes j's parked event
        gates[1].set()
        await settling  # the dead letter is written, a parked
        deliveries.end(in_hand)  # batch 1's task ends (Deliveries.deliver's finally)
        if gap != "claim_ahead":
            gates[2].set()
            started_ahead = await taking
        second = await started_ahead.events()
        deliveries.take(second, time.monotonic())
        await hand_to_sink(sink, second.events, deliveries.holds)

    asyncio.run(scenario())
    assert 1 in written and "a" in reading.parked
    assert [e.id for e in sink.delivered if e.key == "a"] == [], "a's later event went out past its dead letter"


class SlowTable:
    """The outbox table behind one connection (TableLink's _turn lock): its parked_keys SELECT takes a while."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str | None]] = []  # (event id, key) of rows pending behind a dead letter
        self.turn = asyncio.Lock()
        self.selecting = asyncio.Event()
        self.answer = asyncio.Event()

    async def handed_over(self, limit: int) -> list[tuple[Any, ...]]:
        return []  # nothing may go: the key's dead letter was skipped, nothing else of it is in the table

    async def parked_keys(self) -> set[str]:
        async with self.turn:
            seen = {key for _, key in self.rows if key is not None}  # the statement's snapshot
            self.selecting.set()
            await self.answer.wait()
            return seen

    async def write(self, event: Event, **_: object) -> None:
        async with self.turn:
            self.rows.append((event.id, event.key))


def test_a_parked_events_write_during_the_sweeps_select_keeps_its_key_parked() -> None:
    """Key k is parked in memory; the operator skipped its dead letter, so the table holds nothing of k. The
    leader's sweep (Leader._sweep) clears newly_parked and runs parked_keys(). A take meanwhile parks k's next
    event (event 1): its INSERT waits for the connection, after the SELECT. The sweep then sets
    reading.parked = (the SELECT's keys, without k) | newly_parked (only dead letters add to it): k is no longer
    parked while event 1 sits in the table behind nothing. The next take sends k's event 2 straight to the sink;
    event 1 goes from the table at a later sweep, after it."""
    sink = MemorySink()
    source, deliveries, reading = _log_room(["k"], sink)
    reading.parked = {"k"}
    table = SlowTable()
    source.leader.link = table  # type: ignore[assignment]

    async def scenario() -> None:
        sweeping = asyncio.create_task(source.leader._sweep(reading, asyncio.Event()))
        await table.selecting.wait()
        taking = asyncio.create_task(source.take(10, max_bytes=1 << 20))  # event 1 is parked: its INSERT waits
        await asyncio.sleep(0)
        table.answer.set()
        await sweeping
        first = await (await taking).events()
        assert first.events == [] and table.rows == [(1, "k")]
        # k's next event is read
        transaction = reading.window.begin()
        event = Event(2, "t", "k", b"{}", {}, "id-2", 0, NOW)
        reading.ready.append(reading.window.add(event, transaction, row=True))
        second = await (await source.take(10, max_bytes=1 << 20, chain=deliveries.chain(time.monotonic()))).events()
        deliveries.take(second, time.monotonic())
        await hand_to_sink(sink, second.events, deliveries.holds)

    asyncio.run(scenario())
    assert [e.id for e in sink.delivered] == [], "k's event 2 went to the sink while event 1 waits in the table"


def test_a_retried_events_key_is_not_started_afresh_while_another_keys_dead_letter_is_written() -> None:
    """The same gap for a retry: batch 1 is [x1, a2]; x1 is dead-lettered, a2 is to be retried. The confirm
    untakes both, then awaits x1's INSERT before it reaches a2 (not blocked yet, a's count 0). A claim ahead
    meanwhile hands out a3 unchained; it enters the room after batch 1 ended, lifts a's hold, and a3 reaches
    the sink before a2's retry."""
    sink = MemorySink(fail=lambda e: {1: Failure("poison", permanent=True), 2: Failure("busy")}.get(e.id))
    source, deliveries, _ = _log_room(["x", "a", "a"], sink)
    gate, writing = asyncio.Event(), asyncio.Event()

    async def write(event: Event, **_: object) -> None:
        writing.set()
        await gate.wait()

    source.leader.link.write = write  # type: ignore[method-assign]

    async def scenario() -> None:
        first = await (await source.take(2, max_bytes=1 << 20)).events()
        in_hand = deliveries.take(first, time.monotonic())
        await hand_to_sink(sink, first.events, deliveries.holds)
        settling = asyncio.create_task(
            source.confirm(first, time.monotonic() + 30, dead=[Dead(1, "poison")], retry=[Retry(2, 60.0, "busy")])
        )
        await writing.wait()
        ahead = await source.take(10, max_bytes=1 << 20, chain=deliveries.chain(time.monotonic()))
        gate.set()
        await settling
        deliveries.end(in_hand)
        second = await ahead.events()
        deliveries.take(second, time.monotonic())
        await hand_to_sink(sink, second.events, deliveries.holds)

    asyncio.run(scenario())
    assert [e.id for e in sink.delivered] == [], "a3 went out while a2 waits for its retry"


def test_a_given_back_events_key_is_not_started_afresh_while_a_parked_event_of_another_key_is_written() -> None:
    """The same gap in a give back: a claim [x1, a2] goes back unpublished (started ahead, not wanted), and x
    was parked meanwhile, so x1 goes to the table behind x's dead letter. While that INSERT waits, a take must
    not hand out a3 ahead of a2, which is not blocked behind its key yet."""
    sink = MemorySink()
    source, deliveries, reading = _log_room(["x", "a", "a"], sink)
    gate, writing = asyncio.Event(), asyncio.Event()
    written: list[int] = []

    async def write(event: Event, **_: object) -> None:
        writing.set()
        await gate.wait()
        written.append(event.id)

    source.leader.link.write = write  # type: ignore[method-assign]

    async def scenario() -> None:
        first = await (await source.take(2, max_bytes=1 << 20)).events()
        reading.park("x")  # x's earlier event was dead-lettered by another batch meanwhile
        giving_back = asyncio.create_task(deliveries.give_back(first))
        await writing.wait()
        ahead = await source.take(10, max_bytes=1 << 20, chain=deliveries.chain(time.monotonic()))
        gate.set()
        await giving_back
        second = await ahead.events()
        deliveries.take(second, time.monotonic())
        await hand_to_sink(sink, second.events, deliveries.holds)

    asyncio.run(scenario())
    assert written == [1]
    assert [e.id for e in sink.delivered] == [], "a3 went out while a2 was being given back"
    assert [p.id for p in reading.blocked["a"].events] == [2, 3], "a's events wait in order"


def test_a_row_whose_id_is_a_messages_lsn_goes_in_another_batch_and_both_are_confirmed() -> None:
    """A message's event id is its LSN, a row's its id: the two can meet. One batch holding both would keep
    one of them taken for ever (the batch's events are held by id), its transaction never confirmed."""
    sink = MemorySink()
    source, deliveries, reading = _log_room([], sink)
    transaction = reading.window.begin()
    for event_id, row in [(7, True), (7, False), (8, True)]:
        event = Event(event_id, "t", None, b"{}", {}, f"id-{event_id}-{row}", 0, NOW)
        reading.ready.append(reading.window.add(event, transaction, row=row))
    transaction.end_lsn = 200

    async def scenario() -> list[list[int]]:
        batches = []
        while not reading.settled():
            claim = await (await source.take(10, max_bytes=1 << 20)).events()
            batches.append([e.id for e in claim.events])
            await deliveries.deliver(deliveries.take(claim, time.monotonic()))
        return batches

    assert asyncio.run(scenario()) == [[7], [7, 8]]
    assert len(sink.delivered) == 3 and reading.delivered_rows == [7, 8]
    assert reading.window.confirmable() == 200, "every event done: the transaction may be confirmed"
